/* The pod sandbox's process (what registry.k8s.io/pause runs): holds the pod's namespaces, reaps
 * the zombies that end up with it, and exits on SIGINT or SIGTERM. Built static by
 * scripts/install-node.sh, so its image needs nothing else. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
        sigaction(SIGCHLD, &on_child, NULL) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
