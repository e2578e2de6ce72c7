//! End to end (in-memory API server): the flap guard. A ConfigMap whose content changes in more
//! than `--flap-threshold` change windows flaps: its dependents get one `ConfigFlapping`
//! Warning, its next change is held (pending, not touched), and a change of another reference
//! of the same workload rolls at once, to the latest content of both.
//!
//! It needs its own threshold, so it runs on the stand-in only: a real cluster's confighash
//! runs with the real tier's (scripts/real-tier.sh), which no scenario reaches. The guard's
//! intervals are tested with the fake clock (crates/watcher/src/state/tests/flap.rs).

use crate::support;

use confighash::core::names::CONFIG_FLAPPING_REASON;
use confighash::watcher::WatcherConfig;
use support::{Env, Setup};

/// The value of an unlabelled series in confighash's metrics.
fn metric(env: &Env, name: &str) -> f64 {
    env.metrics
        .encode()
        .lines()
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name).then(|| value.parse().ok())?
        })
        .unwrap_or(f64::NAN)
}

#[tokio::test]
async fn a_flapping_config_map_is_held_while_another_reference_rolls_at_once() {
    let Some(env) = Env::stand_in_with(
        "a_flapping_config_map_is_held_while_another_reference_rolls_at_once",
        "sets --flap-threshold, reads the watcher's metrics",
        Setup {
            watcher: WatcherConfig {
                flap_threshold: 2,
                ..Setup::default().watcher
            },
            ..Default::default()
        },
    )
    .await
    else {
        return;
    };
    env.namespace("shop", true).await;
    env.config_map("shop", "token", &[("t", "0")]).await;
    env.config_map("shop", "app-env", &[("LOG_LEVEL", "info")])
        .await;
    env.deployment(
        "shop",
        "web",
        &[("envFrom", "token"), ("envFrom", "app-env")],
    )
    .await;
    env.wait_first_revision("shop", "Deployment", "web").await;
    // A change before the watcher's first sync is reconcile's, not a change window's.
    env.wait_synced().await;

    // Three change windows: each rolls, and the third makes the token flap.
    for i in 1..=3u64 {
        env.config_map("shop", "token", &[("t", &i.to_string())])
            .await;
        env.wait_rollouts("shop", "Deployment", "web", i).await;
    }
    env.eventually("one ConfigFlapping Event on web", || async {
        env.events("shop", "web", CONFIG_FLAPPING_REASON).await == 1
    })
    .await;
    assert_eq!(metric(&env, "confighash_config_flapping_objects"), 1.0);

    // The next change is held: seen, and not touched. The barrier's ConfigMap comes after it on
    // the same watch, so once the barrier has rolled and the watcher has settled, the change
    // was handled; held, it is not even pending (it is released when the interval ends).
    let seen = metric(&env, "confighash_config_changes_total{kind=\"ConfigMap\"}");
    env.config_map("shop", "token", &[("t", "4")]).await;
    env.barrier("shop").await;
    assert!(metric(&env, "confighash_config_changes_total{kind=\"ConfigMap\"}") >= seen + 2.0);
    assert_eq!(env.rollouts("shop", "Deployment", "web").await, 3, "held");
    assert_eq!(metric(&env, "confighash_config_flapping_objects"), 1.0);

    // A change of the other reference rolls at once, to both objects' latest content.
    let before = env.stamp("shop", "Deployment", "web").await;
    env.config_map("shop", "app-env", &[("LOG_LEVEL", "debug")])
        .await;
    env.wait_rollouts("shop", "Deployment", "web", 4).await;
    env.eventually("nothing left pending", || async {
        metric(&env, "confighash_touches_pending") == 0.0
            && metric(&env, "confighash_touches_in_flight") == 0.0
    })
    .await;
    assert_eq!(env.rollouts("shop", "Deployment", "web").await, 4);
    assert_ne!(env.stamp("shop", "Deployment", "web").await, before);
    assert_eq!(
        env.events("shop", "web", CONFIG_FLAPPING_REASON).await,
        1,
        "once per episode"
    );
}
