//! A master group of three replicas, chunkservers and a client, all through the real
//! drivers over the in-memory test kit, in virtual time: the leader is killed while the
//! client works, and the client, following the group, loses nothing it was told is done.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::future::{AbortHandle, Abortable};
use prost::Message;
use tessera_core::chunkserver::ChunkserverConfig;
use tessera_core::client::{Client, ClientConfig};
use tessera_core::driver::{Quiet, chunkserver, group};
use tessera_core::group::GroupConfig;
use tessera_core::master::MasterConfig;
use tessera_core::pb;
use tessera_core::runtime::{Runtime, Transport};
use tessera_core::testkit::{MemChunkStore, MemMetaStore, MemNet, TestRuntime};

const MASTERS: &str = "m1,m2,m3";

fn members() -> BTreeMap<u64, String> {
    (1..=3).map(|i| (i, format!("m{i}"))).collect()
}

fn start_replica(
    rt: &TestRuntime,
    net: &MemNet,
    store: &MemMetaStore,
    id: u64,
    bootstrap: bool,
) -> AbortHandle {
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
        bootstrap,
        join: false,
        checkpoint_delay: Duration::ZERO,
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

/// Three replicas forming a new group, each on a store of its own.
fn start_group(rt: &TestRuntime, net: &MemNet) -> (Vec<MemMetaStore>, Vec<AbortHandle>) {
    let stores: Vec<MemMetaStore> = (0..3).map(|_| MemMetaStore::default()).collect();
    let handles = (0..3)
        .map(|i| start_replica(rt, net, &stores[i], i as u64 + 1, true))
        .collect();
    (stores, handles)
}

/// A client of the replicas `list`, patient for 20 s.
fn client_of(rt: &TestRuntime, net: &MemNet, list: &str) -> Client<TestRuntime, MemNet> {
    let mut cfg = ClientConfig::new(list);
    cfg.retry_for = Duration::from_secs(20);
    Client::new(rt.clone(), net.clone(), cfg)
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
        let (stores, mut handles) = start_group(&rt, &net);
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
        handles[l] = start_replica(&rt, &net, &stores[l], l as u64 + 1, false);
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

/// With two replicas of three dead, no leader can be elected: mutations wait, but
/// reads go on, answered by the surviving shadow from what it applied, chunk locations
/// included (chunkservers send every replica their heartbeats), each answer saying it
/// came from a shadow.
#[test]
fn a_shadow_answers_reads_while_no_leader_can_be_elected() {
    let rt = TestRuntime::new(4);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let (_stores, handles) = start_group(&rt, &net);
        let disks: Vec<MemChunkStore> = (0..3).map(|_| MemChunkStore::default()).collect();
        for (i, d) in disks.iter().enumerate() {
            start_chunkserver(&rt, &net, d, i);
        }
        let client = client_of(&rt, &net, MASTERS);
        client.mkdir("/d", false).await.unwrap();
        let data = data(150_000, 3);
        client.put("/d/f", 3, data.clone()).await.unwrap();
        assert_eq!(client.last_shadow_answer(), None);
        // Heartbeats (and their copies) reach every replica.
        rt.sleep(Duration::from_secs(3)).await;
        let leader = client.current_master();
        let l: usize = leader[1..].parse::<usize>().unwrap() - 1;
        let s = (l + 1) % 3;
        // The shadow knows where the chunks are from the copies of the heartbeats the
        // chunkservers send the leader.
        let ask = pb::MasterRequest {
            req: Some(pb::master_request::Req::GetChunks(pb::GetChunksRequest {
                path: "/d/f".into(),
                ..Default::default()
            })),
            stale_ok: true,
            ..Default::default()
        };
        let deadline = rt.now() + Duration::from_secs(2);
        let got = net
            .call(
                &format!("m{}", s + 1),
                tessera_core::auth::ServerRole::Master,
                ask.encode_to_vec().into(),
                deadline,
            )
            .await
            .unwrap();
        let got = pb::MasterResponse::decode(got).unwrap();
        assert!(got.shadow.is_some());
        match got.resp {
            Some(pb::master_response::Resp::GetChunks(c)) => {
                assert_eq!(c.chunks.len(), 3);
                assert!(c.chunks.iter().all(|c| c.replicas.len() == 3), "{c:?}");
            }
            other => panic!("{other:?} {:?}", got.error),
        }
        for dead in (0..3).filter(|&i| i != s) {
            handles[dead].abort();
            net.kill(&format!("m{}", dead + 1));
        }
        let before = rt.now();
        let info = client.stat("/d/f").await.unwrap();
        assert_eq!(info.length, 150_000);
        let sh = client.last_shadow_answer().expect("a shadow answered");
        assert_eq!(sh.address, format!("m{}", s + 1));
        // The shadow counts its lag when it answers; the answer takes a network hop (1 ms
        // here) to come back, so the time since the kill is at most that much longer.
        let elapsed = rt.now().saturating_sub(before).as_millis() as u64;
        assert!(
            sh.lag_ms + 1 >= elapsed && elapsed >= 500,
            "lag {} ms, {elapsed} ms since the kill",
            sh.lag_ms
        );
        assert_eq!(client.read("/d/f", 0, 150_000).await.unwrap(), data);
        assert!(client.last_shadow_answer().is_some());
        let names: Vec<String> = client
            .list("/d", false)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(names, ["/d/f"]);
        let report = client.report().await.unwrap();
        assert_eq!((report.files, report.missing), (1, 0));
        assert_eq!(report.servers.len(), 3);
        eprintln!("shadow {} answered, {} ms behind", sh.address, sh.lag_ms);
        // No majority: a mutation is not done.
        assert!(client.mkdir("/never", false).await.is_err());
    });
}

/// A read whose first listed replica is down goes on to the others and is answered by
/// the leader, not by a shadow that happens to be next: a shadow answers a read only
/// once every replica was asked and none led to an answer.
#[test]
fn a_read_past_a_dead_first_replica_is_answered_by_the_leader() {
    let rt = TestRuntime::new(6);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let (_stores, handles) = start_group(&rt, &net);
        let client = client_of(&rt, &net, MASTERS);
        client.mkdir("/d", false).await.unwrap();
        let leader = client.current_master();
        let l: usize = leader[1..].parse::<usize>().unwrap() - 1;
        // The dead one first, then the other shadow, then the leader.
        let dead = (l + 1) % 3;
        let other = (l + 2) % 3;
        handles[dead].abort();
        net.kill(&format!("m{}", dead + 1));
        let list = format!("m{},m{},m{}", dead + 1, other + 1, l + 1);
        let reader = client_of(&rt, &net, &list);
        reader.stat("/d").await.unwrap();
        assert_eq!(
            reader.last_shadow_answer(),
            None,
            "a shadow answered (list {list})"
        );
        assert_eq!(reader.current_master(), leader);
    });
}

/// After the leader's death, a client that keeps asking for it is answered soon after
/// the new leader serves: its waits between attempts, while it looks for a leader, stay
/// short (`LEADER_SEARCH_BACKOFF`), instead of doubling to seconds while the election
/// runs. Five kills, so elections end at several points of the client's waits.
#[test]
fn a_client_finds_the_new_leader_soon_after_it_serves() {
    use std::sync::{Arc, Mutex};
    use tessera_core::client::LEADER_SEARCH_BACKOFF;
    use tessera_core::types::Time;
    let rt = TestRuntime::new(7);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let (stores, mut handles) = start_group(&rt, &net);
        let client = client_of(&rt, &net, MASTERS);
        client.mkdir("/d", false).await.unwrap();
        let mut late = Vec::new();
        for k in 0..5 {
            let leader = client.current_master();
            let l: usize = leader[1..].parse::<usize>().unwrap() - 1;
            handles[l].abort();
            stores[l].crash();
            net.kill(&leader);
            let killed = rt.now();
            // Asks the others every 10 ms whether one serves as leader.
            let served: Arc<Mutex<Option<Time>>> = Arc::default();
            let (rt3, net3, seen) = (rt.clone(), net.clone(), served.clone());
            let others: Vec<String> = (1..=3)
                .map(|i| format!("m{i}"))
                .filter(|a| *a != leader)
                .collect();
            rt.spawn(async move {
                loop {
                    for a in &others {
                        let ask = pb::MasterRequest {
                            req: Some(pb::master_request::Req::ReplicaStatus(pb::Empty {})),
                            ..Default::default()
                        };
                        let deadline = rt3.now() + Duration::from_millis(100);
                        let Ok(got) = net3.call(a, tessera_core::auth::ServerRole::Master, ask.encode_to_vec().into(), deadline).await
                        else {
                            continue;
                        };
                        if let Ok(pb::MasterResponse {
                            resp: Some(pb::master_response::Resp::ReplicaStatus(s)),
                            ..
                        }) = pb::MasterResponse::decode(got)
                            && s.serving
                        {
                            *seen.lock().unwrap() = Some(rt3.now());
                            return;
                        }
                    }
                    rt3.sleep(Duration::from_millis(10)).await;
                }
            });
            client.mkdir(&format!("/after{k}"), false).await.unwrap();
            let answered = rt.now();
            let served = served.lock().unwrap().expect("a new leader served");
            let gap = answered.saturating_sub(served);
            eprintln!(
                "kill {k}: a leader served {:?} after the kill, the client was answered {gap:?} after that",
                served.saturating_sub(killed)
            );
            late.push(gap);
            // Back, to be a voter again before the next kill.
            handles[l] = start_replica(&rt, &net, &stores[l], l as u64 + 1, false);
            rt.sleep(Duration::from_secs(3)).await;
        }
        let worst = late.iter().max().copied().unwrap();
        assert!(
            worst <= LEADER_SEARCH_BACKOFF + Duration::from_millis(50),
            "the client was answered up to {worst:?} after a new leader served: {late:?}"
        );
    });
}
