//! A master group of three replicas, chunkservers and a client, all through the real
//! drivers over the in-memory test kit, in virtual time: the leader is killed while the
//! client works, and the client, following the group, loses nothing it was told is done.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::future::{AbortHandle, Abortable};
use tessera_core::chunkserver::ChunkserverConfig;
use tessera_core::client::{Client, ClientConfig};
use tessera_core::driver::{Quiet, chunkserver, group};
use tessera_core::group::GroupConfig;
use tessera_core::master::MasterConfig;
use tessera_core::runtime::Runtime;
use tessera_core::testkit::{MemChunkStore, MemMetaStore, MemNet, TestRuntime};

const MASTERS: &str = "m1,m2,m3";

fn members() -> BTreeMap<u64, String> {
    (1..=3).map(|i| (i, format!("m{i}"))).collect()
}

fn start_replica(rt: &TestRuntime, net: &MemNet, store: &MemMetaStore, id: u64) -> AbortHandle {
    let mut g = GroupConfig::new(id, members());
    g.seed = 11;
    g.snapshot_every = 50;
    let opts = group::GroupOptions {
        group: g,
        master: MasterConfig {
            chunk_size: 64 * 1024,
            lease_duration: Duration::from_secs(10),
            max_clock_skew: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(3),
            rng_seed: id,
            ..MasterConfig::default()
        },
        tick: Duration::from_millis(500),
        call_timeout: Duration::from_secs(2),
    };
    let (handle, reg) = AbortHandle::new_pair();
    let fut = group::run(rt.clone(), net.clone(), store.clone(), opts, Quiet);
    rt.spawn(async move {
        if let Ok(Err(e)) = Abortable::new(fut, reg).await {
            panic!("master replica {id} stopped: {e}");
        }
    });
    handle
}

fn start_chunkserver(rt: &TestRuntime, net: &MemNet, store: &MemChunkStore, i: usize) {
    let opts = chunkserver::ChunkserverOptions {
        config: ChunkserverConfig {
            address: format!("cs{i}"),
            rack: format!("rack{}", i % 2),
            capacity_bytes: 1 << 30,
            ..ChunkserverConfig::default()
        },
        master: MASTERS.into(),
        heartbeat_interval: Duration::from_secs(1),
        call_timeout: Duration::from_secs(2),
    };
    let fut = chunkserver::run(rt.clone(), net.clone(), store.clone(), opts, Quiet);
    rt.spawn(async move {
        if let Err(e) = fut.await {
            panic!("chunkserver stopped: {e}");
        }
    });
}

fn data(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

#[test]
fn the_client_follows_the_group_across_the_leaders_death() {
    let rt = TestRuntime::new(3);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let stores: Vec<MemMetaStore> = (0..3).map(|_| MemMetaStore::default()).collect();
        let mut handles: Vec<AbortHandle> = (0..3)
            .map(|i| start_replica(&rt, &net, &stores[i], i as u64 + 1))
            .collect();
        let disks: Vec<MemChunkStore> = (0..3).map(|_| MemChunkStore::default()).collect();
        for (i, d) in disks.iter().enumerate() {
            start_chunkserver(&rt, &net, d, i);
        }
        let client = Client::new(rt.clone(), net.clone(), ClientConfig::new(MASTERS));
        for i in 0..10 {
            client.mkdir(&format!("/d{i}"), false).await.unwrap();
        }
        let before = data(200_000, 1);
        client.put("/f", 3, before.clone()).await.unwrap();
        assert_eq!(client.read("/f", 0, 200_000).await.unwrap(), before);

        // Kill -9 the leader: its task stops, its unsynced writes are lost, nobody
        // reaches it.
        let leader = client.current_master();
        let l: usize = leader[1..].parse::<usize>().unwrap() - 1;
        handles[l].abort();
        stores[l].crash();
        net.kill(&leader);
        let killed = rt.now();
        client.mkdir("/after", false).await.unwrap();
        let pause = rt.now().saturating_sub(killed);
        let new = client.current_master();
        assert_ne!(new, leader, "the client moved to the new leader");
        eprintln!("leader {leader} killed; {new} answered a mkdir {pause:?} later");
        assert!(pause < Duration::from_secs(10), "{pause:?}");

        for i in 0..10 {
            client.stat(&format!("/d{i}")).await.unwrap();
        }
        assert_eq!(client.read("/f", 0, 200_000).await.unwrap(), before);
        let later = data(100_000, 2);
        client.put("/g", 3, later.clone()).await.unwrap();
        assert_eq!(client.read("/g", 0, 100_000).await.unwrap(), later);
        assert!(
            client.mkdir("/d3", false).await.is_err(),
            "a mkdir of an existing directory still fails"
        );

        // The dead replica comes back and catches up; the next kill leaves it leading or
        // following, and nothing is lost either way.
        handles[l] = start_replica(&rt, &net, &stores[l], l as u64 + 1);
        rt.sleep(Duration::from_secs(5)).await;
        let second = client.current_master();
        let s: usize = second[1..].parse::<usize>().unwrap() - 1;
        handles[s].abort();
        stores[s].crash();
        net.kill(&second);
        client.mkdir("/after2", false).await.unwrap();
        for p in ["/d0", "/d9", "/after", "/after2", "/f", "/g"] {
            client.stat(p).await.unwrap();
        }
        assert_eq!(client.read("/g", 0, 100_000).await.unwrap(), later);
    });
}
