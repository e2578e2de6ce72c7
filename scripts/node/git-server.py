#!/usr/bin/env python3
"""A git server for the gitops tier: git's smart HTTP protocol, served by `git http-backend` (a
CGI program) behind this small HTTP server. Read-only: pushes are refused (the tier commits in
the repositories' folder itself).

    git-server.py --root DIR --listen 127.0.0.1:8418

serves DIR/NAME.git as http://127.0.0.1:8418/NAME.git. Run it inside the tier's network namespace
only: it listens where it is told and dials nothing.
"""

import argparse
import http.server
import os
import shutil
import subprocess
import sys

BACKEND = "/usr/lib/git-core/git-http-backend"
# The services a fetch uses; receive-pack (push) is not served.
READ_ONLY = ("/info/refs", "/git-upload-pack", "/HEAD", "/objects/")


class Handler(http.server.BaseHTTPRequestHandler):
    root = "."
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # one line per request, to stderr
        sys.stderr.write("git-server.py: %s %s\n" % (self.address_string(), format % args))

    def do_GET(self):
        self.cgi()

    def do_POST(self):
        self.cgi()

    def cgi(self):
        path, _, query = self.path.partition("?")
        if ".." in path.split("/") or not any(part in path for part in READ_ONLY) or "service=git-receive-pack" in query:
            self.send_error(403, "read-only")
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = self.read_chunked()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": self.root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
        }
        p = subprocess.run([BACKEND], input=body, env=env, capture_output=True)
        if p.returncode != 0:
            sys.stderr.write("git-server.py: git http-backend exited %d: %s\n" % (p.returncode, p.stderr.decode(errors="replace")[-400:]))
        head, sep, payload = p.stdout.partition(b"\r\n\r\n")
        if not sep:
            head, sep, payload = p.stdout.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def read_chunked(self):
        out = b""
        while True:
            size = int(self.rfile.readline().strip().split(b";")[0], 16)
            if size == 0:
                self.rfile.readline()
                return out
            out += self.rfile.read(size)
            self.rfile.readline()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="the folder of the bare repositories")
    parser.add_argument("--listen", default="127.0.0.1:8418", help="ADDRESS:PORT")
    args = parser.parse_args()
    if not shutil.which(BACKEND):
        sys.exit(f"git-server.py: {BACKEND} is missing (Debian's git)")
    host, _, port = args.listen.rpartition(":")
    Handler.root = os.path.abspath(args.root)
    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    sys.stderr.write(f"git-server.py: serving {Handler.root} on http://{args.listen}/\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
