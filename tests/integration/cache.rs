//! The compiled-code cache: a restart loads jobs without recompiling; a bad entry is rebuilt.

use std::time::Duration;

use crate::harness::{HostProcess, LEASEHOLD, RedisServer, TempDir, deadline, guests};

fn start(redis: &RedisServer, dir: &TempDir) -> HostProcess {
    let (jobs, cache) = (dir.join("jobs"), dir.join("cache"));
    let cache = ["--cache-dir", cache.to_str().unwrap()];
    HostProcess::start_node(
        LEASEHOLD,
        &redis.url(),
        &jobs,
        "n1",
        ("1s", "200ms"),
        &cache,
    )
}

async fn loaded(host: &mut HostProcess) -> String {
    let line = host
        .wait_for_log("loaded job", Duration::from_secs(60))
        .await;
    assert!(host.terminate(Duration::from_secs(20)).await);
    line
}

#[tokio::test]
async fn a_restart_loads_compiled_code_from_the_cache_and_rebuilds_a_bad_entry() {
    deadline(Duration::from_secs(180), async {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("cache");
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::copy(
            guests().wasm("reconciliation"),
            dir.join("jobs/reconciliation.wasm"),
        )
        .unwrap();

        let first = loaded(&mut start(&redis, &dir)).await;
        assert!(first.contains("\"compiled\":\"fresh\""), "{first}");
        let entries: Vec<_> = std::fs::read_dir(dir.join("cache"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert!(
            entries[0].extension().is_some_and(|x| x == "cwasm"),
            "{entries:?}"
        );

        let second = loaded(&mut start(&redis, &dir)).await;
        assert!(second.contains("\"compiled\":\"cached\""), "{second}");

        std::fs::write(&entries[0], b"not compiled code").unwrap();
        let mut host = start(&redis, &dir);
        host.wait_for_log(
            "compiled-code cache entry unusable",
            Duration::from_secs(60),
        )
        .await;
        let third = loaded(&mut host).await;
        assert!(third.contains("\"compiled\":\"fresh\""), "{third}");
        let fourth = loaded(&mut start(&redis, &dir)).await;
        assert!(fourth.contains("\"compiled\":\"cached\""), "{fourth}");
    })
    .await;
}
