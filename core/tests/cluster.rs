//! A whole cluster — master, chunkservers, client — running through the real drivers over
//! the in-memory test kit, in virtual time.

use std::time::Duration;

use bytes::Bytes;
use futures::future::{AbortHandle, Abortable};
use tessera_core::chunkserver::ChunkserverConfig;
use tessera_core::client::{Client, ClientConfig, PutError};
use tessera_core::driver::{Quiet, checkpoint, chunkserver, master};
use tessera_core::error::FsError;
use tessera_core::master::MasterConfig;
use tessera_core::pb;
use tessera_core::runtime::Runtime;
use tessera_core::testkit::{MemChunkStore, MemMetaStore, MemNet, TestRuntime};

const CHUNK: u64 = 256 * 1024;

fn master_opts(chunk_size: u64) -> master::MasterOptions {
    master::MasterOptions {
        config: MasterConfig {
            chunk_size,
            lease_duration: Duration::from_secs(10),
            max_clock_skew: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(3),
            checkpoint_every: 20,
            ..MasterConfig::default()
        },
        listen: "master".into(),
        tick: Duration::from_millis(500),
        call_timeout: Duration::from_secs(2),
        checkpoint_delay: Duration::ZERO,
        checkpoint_part_bytes: 0,
    }
}

fn start_master(rt: &TestRuntime, net: &MemNet, store: &MemMetaStore) -> AbortHandle {
    start_master_with(rt, net, store, CHUNK)
}

/// A master whose new files get chunks of `chunk_size`.
fn start_master_with(
    rt: &TestRuntime,
    net: &MemNet,
    store: &MemMetaStore,
    chunk_size: u64,
) -> AbortHandle {
    start_master_opts(rt, net, store, master_opts(chunk_size))
}

fn start_master_opts(
    rt: &TestRuntime,
    net: &MemNet,
    store: &MemMetaStore,
    opts: master::MasterOptions,
) -> AbortHandle {
    let (handle, reg) = AbortHandle::new_pair();
    let fut = master::run(rt.clone(), net.clone(), store.clone(), opts, Quiet);
    rt.spawn(async move {
        if let Ok(Err(e)) = Abortable::new(fut, reg).await {
            panic!("master stopped: {e}");
        }
    });
    handle
}

fn start_chunkserver(
    rt: &TestRuntime,
    net: &MemNet,
    store: &MemChunkStore,
    i: usize,
) -> AbortHandle {
    start_chunkserver_at(rt, net, store, &format!("cs{i}"), "master", i)
}

/// Chunkserver `i`, at `address`, heartbeating to the master at `master`.
fn start_chunkserver_at(
    rt: &TestRuntime,
    net: &MemNet,
    store: &MemChunkStore,
    address: &str,
    master: &str,
    i: usize,
) -> AbortHandle {
    let (handle, reg) = AbortHandle::new_pair();
    let opts = chunkserver::ChunkserverOptions {
        config: ChunkserverConfig {
            address: address.into(),
            rack: format!("rack{}", i % 2),
            capacity_bytes: 1 << 30,
            clone_piece: 64 * 1024,
            // Odd servers read everything from disk, so corruption put on their disks
            // meets reads; even ones serve recent writes from memory.
            read_cache_bytes: if i.is_multiple_of(2) { 64 << 20 } else { 0 },
            ..ChunkserverConfig::default()
        },
        master: master.into(),
        heartbeat_interval: Duration::from_secs(1),
        call_timeout: Duration::from_secs(2),
    };
    let fut = chunkserver::run(rt.clone(), net.clone(), store.clone(), opts, Quiet);
    rt.spawn(async move {
        if let Ok(Err(e)) = Abortable::new(fut, reg).await {
            panic!("chunkserver stopped: {e}");
        }
    });
    handle
}

/// `n` chunkservers on fresh in-memory disks: the disks, and a handle to stop each.
fn start_chunkservers(
    rt: &TestRuntime,
    net: &MemNet,
    n: usize,
) -> (Vec<MemChunkStore>, Vec<AbortHandle>) {
    let disks: Vec<MemChunkStore> = (0..n).map(|_| MemChunkStore::default()).collect();
    let servers = disks
        .iter()
        .enumerate()
        .map(|(i, d)| start_chunkserver(rt, net, d, i))
        .collect();
    (disks, servers)
}

fn data(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

#[test]
fn cluster_survives_chunkserver_loss_master_crash_and_corruption() {
    let rt = TestRuntime::new(7);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let mut m = start_master(&rt, &net, &meta);
        let (disks, mut servers) = start_chunkservers(&rt, &net, 4);
        rt.sleep(Duration::from_secs(2)).await;

        let mut cfg = ClientConfig::new("master");
        cfg.rpc_timeout = Duration::from_secs(2);
        cfg.retry_for = Duration::from_secs(60);
        let client = Client::new(rt.clone(), net.clone(), cfg);
        client.mkdir("/data", false).await.unwrap();
        client.create("/data/f", 3).await.unwrap();
        let content = data(CHUNK as usize * 3 + 1000, 1);
        client.write("/data/f", 0, content.clone()).await.unwrap();
        assert_eq!(
            client.stat("/data/f").await.unwrap().length,
            content.len() as u64
        );
        assert_eq!(client.read("/data/f", 0, u64::MAX).await.unwrap(), content);
        // A read in the middle, across a chunk boundary.
        let mid = client.read("/data/f", CHUNK - 10, 20).await.unwrap();
        assert_eq!(mid, content.slice(CHUNK as usize - 10..CHUNK as usize + 10));

        // Errors are values: wrong paths, wrong kinds.
        assert!(client.read("/data/missing", 0, 1).await.is_err());
        assert!(client.mkdir("/data/f/sub", false).await.is_err());

        // Lose a chunkserver: reads still succeed from the other replicas, and the
        // master brings every chunk back to three replicas.
        servers[0].abort();
        net.kill("cs0");
        assert_eq!(client.read("/data/f", 0, u64::MAX).await.unwrap(), content);
        // Repair starts once the write's leases have lapsed (10 s + skew).
        rt.sleep(Duration::from_secs(25)).await;
        let replicas = |d: &[MemChunkStore]| -> Vec<usize> {
            let mut counts = std::collections::BTreeMap::new();
            for disk in &d[1..] {
                for h in disk.handles() {
                    *counts.entry(h).or_insert(0) += 1;
                }
            }
            counts.into_values().collect()
        };
        assert_eq!(
            replicas(&disks),
            vec![3, 3, 3, 3],
            "re-replication onto the three live servers"
        );

        // Crash the master, losing nothing durable; it recovers from checkpoint + log.
        m.abort();
        net.kill("master");
        meta.crash();
        m = start_master(&rt, &net, &meta);
        let _ = &m;
        rt.sleep(Duration::from_secs(3)).await;
        let listing = client.list("/data", false).await.unwrap();
        assert_eq!(listing.len(), 1);
        assert_eq!(listing[0].length, content.len() as u64);
        assert_eq!(client.read("/data/f", 0, u64::MAX).await.unwrap(), content);
        // Writes wait out the lease quiet period after the restart, then go through.
        client
            .write("/data/f", 5, Bytes::from_static(b"HELLO"))
            .await
            .unwrap();
        let mut want = content.to_vec();
        want[5..10].copy_from_slice(b"HELLO");
        assert_eq!(
            client.read("/data/f", 0, u64::MAX).await.unwrap(),
            Bytes::from(want.clone())
        );

        // Silent corruption on one replica: readers never see it, and the copy goes.
        let h = disks[1].handles()[0];
        disks[1].corrupt(h, 3);
        for _ in 0..20 {
            assert_eq!(
                client.read("/data/f", 0, 100).await.unwrap(),
                Bytes::from(want[..100].to_vec())
            );
        }
        // The chunk was just written, so its repair waits for that lease to lapse.
        rt.sleep(Duration::from_secs(30)).await;
        assert_eq!(
            replicas(&disks),
            vec![3, 3, 3, 3],
            "corrupt replica replaced"
        );
        let good = disks[2..]
            .iter()
            .find_map(|d| d.data(h))
            .expect("a good copy");
        for d in &disks[1..] {
            if let Some(bytes) = d.data(h) {
                assert_eq!(bytes, good, "a corrupt copy is still held");
            }
        }

        // Delete, then the chunks are collected once the delay passes (set it short by
        // deleting the hidden name, which reclaims at once).
        client.delete("/data/f", false).await.unwrap();
        let hidden = client.list("/data", true).await.unwrap();
        client.delete(&hidden[0].path, false).await.unwrap();
        rt.sleep(Duration::from_secs(3)).await;
        assert!(replicas(&disks).is_empty(), "orphan replicas deleted");

        // A restarted chunkserver finds its (empty) store and rejoins.
        servers[0] = start_chunkserver(&rt, &net, &disks[0], 0);
        rt.sleep(Duration::from_secs(2)).await;
        for s in servers {
            s.abort();
        }
        m.abort();
    });
}

#[test]
fn listings_and_fsck_come_page_by_page() {
    let rt = TestRuntime::new(11);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let _m = start_master(&rt, &net, &meta);
        let (_disks, _servers) = start_chunkservers(&rt, &net, 3);
        rt.sleep(Duration::from_secs(2)).await;
        let whole = Client::new(rt.clone(), net.clone(), ClientConfig::new("master"));
        // Two entries per page: every answer below takes several pages.
        let mut cfg = ClientConfig::new("master");
        cfg.page = 2;
        let paged = Client::new(rt.clone(), net.clone(), cfg);
        whole.mkdir("/p/sub", true).await.unwrap();
        let mut names = Vec::new();
        for (i, f) in ["/p/a", "/p/b", "/p/c", "/p/sub/x", "/p/sub/y", "/p/z"]
            .into_iter()
            .enumerate()
        {
            whole.create(f, 3).await.unwrap();
            whole.write(f, 0, data(1000, i as u8)).await.unwrap();
            if !f.starts_with("/p/sub/") {
                names.push(f.to_string());
            }
        }
        names.insert(3, "/p/sub".into());
        let listed: Vec<String> = paged
            .list("/p", false)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(listed, names);
        // (Apart from how long the master has still to learn, which time moves on.)
        let one = whole.fsck("/p", true).await.unwrap();
        assert_eq!((one.dirs, one.total_files, one.total_chunks), (1, 6, 6));
        let many = paged.fsck("/p", true).await.unwrap();
        let learning = |r: &pb::FsckResponse| pb::FsckResponse {
            learning_for_ms: 0,
            ..r.clone()
        };
        assert_eq!(learning(&many), learning(&one));
        let mut pages = 0;
        let totals = paged
            .fsck_pages("/p", true, |files| {
                pages += 1;
                assert!(files.len() <= 2);
            })
            .await
            .unwrap();
        assert_eq!(pages, 4, "7 entries, 2 a page");
        assert_eq!(totals.total_files, 6);
        assert!(totals.files.is_empty());
    });
}

#[test]
fn a_chunk_stuck_on_disk_holds_up_no_other_chunk() {
    let rt = TestRuntime::new(5);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let _m = start_master(&rt, &net, &meta);
        let (disks, _servers) = start_chunkservers(&rt, &net, 3);
        rt.sleep(Duration::from_secs(2)).await;
        let mut cfg = ClientConfig::new("master");
        cfg.rpc_timeout = Duration::from_secs(10);
        cfg.retry_for = Duration::ZERO;
        let client = Client::new(rt.clone(), net.clone(), cfg);
        client.create("/a", 3).await.unwrap();
        client.create("/b", 3).await.unwrap();
        client.write("/a", 0, data(1000, 1)).await.unwrap();
        let a = disks[0].handles();
        client.write("/b", 0, data(1000, 2)).await.unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(disks[0].handles().len(), 2);
        // Every disk gets stuck syncing /a's chunk, in the middle of a write to it.
        for d in &disks {
            d.stall(a[0]);
        }
        let (tx, stuck) = futures::channel::oneshot::channel();
        let c = client.clone();
        rt.spawn(async move {
            let _ = tx.send(c.write("/a", 1000, data(500, 3)).await);
        });
        rt.sleep(Duration::from_millis(100)).await;
        // A write to another chunk goes through meanwhile (it waited behind the stuck
        // one when storage ran inline with the rest of the server).
        let other = Box::pin(client.write("/b", 1000, data(500, 4)));
        match futures::future::select(other, Box::pin(rt.sleep(Duration::from_secs(1)))).await {
            futures::future::Either::Left((r, _)) => r.unwrap(),
            futures::future::Either::Right(_) => {
                panic!("a write to another chunk waited for the stuck one")
            }
        }
        for d in &disks {
            d.release(a[0]);
        }
        stuck.await.unwrap().unwrap();
        let want = |x: u8, y: u8| [data(1000, x), data(500, y)].concat();
        assert_eq!(client.read("/a", 0, u64::MAX).await.unwrap(), want(1, 3));
        assert_eq!(client.read("/b", 0, u64::MAX).await.unwrap(), want(2, 4));
    });
}

/// The master goes on while its log syncs: a request that arrives meanwhile is taken at
/// once (a stat of a name that does not exist is answered NotFound during the sync), but
/// the reply to a mutation, its own or one taken meanwhile, waits until its record is
/// durable, and so does a read's (until all that was logged before it is).
#[test]
fn the_master_takes_requests_while_its_log_syncs_and_answers_only_what_is_durable() {
    let rt = TestRuntime::new(17);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let _m = start_master(&rt, &net, &meta);
        rt.sleep(Duration::from_secs(1)).await;
        let mut cfg = ClientConfig::new("master");
        cfg.rpc_timeout = Duration::from_secs(2);
        cfg.retry_for = Duration::from_secs(60);
        let client = Client::new(rt.clone(), net.clone(), cfg.clone());
        client.mkdir("/a", false).await.unwrap();

        meta.stall();
        let mut create = spawn_client(
            &rt,
            &net,
            &cfg,
            |c| async move { c.create("/a/f", 3).await },
        );
        rt.sleep(Duration::from_millis(200)).await;
        let mut mkdir = spawn_client(
            &rt,
            &net,
            &cfg,
            |c| async move { c.mkdir("/b", false).await },
        );
        let mut stat = spawn_client(&rt, &net, &cfg, |c| async move {
            c.stat("/a").await.map(|_| ())
        });
        // A name that does not exist, raced against a second of waiting.
        let missing = client.stat("/nope");
        let wait = rt.sleep(Duration::from_secs(1));
        futures::pin_mut!(missing, wait);
        match futures::future::select(missing, wait).await {
            futures::future::Either::Left((r, _)) => {
                assert!(
                    matches!(r, Err(FsError::NotFound(_))),
                    "a stat of a missing name: {r:?}"
                );
            }
            futures::future::Either::Right(_) => {
                panic!("the master took no request while its log synced")
            }
        }
        assert!(
            matches!(stat.try_recv(), Ok(None)),
            "a read answered before what was logged before it was durable"
        );
        assert!(
            matches!(create.try_recv(), Ok(None)),
            "a create answered before its record was durable"
        );
        assert!(
            matches!(mkdir.try_recv(), Ok(None)),
            "a mkdir answered before its record was durable"
        );

        // The create's sync ends; the mkdir, taken during it, went into the next batch,
        // whose sync is stalled in turn: the create is answered, the mkdir and the stat
        // (taken after the mkdir was logged) are not.
        meta.release_one();
        create.await.unwrap().expect("the create, once durable");
        rt.sleep(Duration::from_millis(500)).await;
        assert!(
            matches!(mkdir.try_recv(), Ok(None)),
            "a mkdir answered when the batch before its own was durable"
        );
        assert!(
            matches!(stat.try_recv(), Ok(None)),
            "a read answered before what was logged before it was durable"
        );

        meta.release();
        mkdir.await.unwrap().expect("the mkdir, once durable");
        stat.await
            .unwrap()
            .expect("the stat, once the log before it is durable");
        assert!(client.stat("/b").await.is_ok());
        assert!(client.stat("/a/f").await.is_ok());
    });
}

/// A master whose log sync is stuck takes requests only until the next batch holds
/// `MAX_WAITING` writes: then new requests wait in the transport (whose bounded queue
/// pushes back on callers), and are taken once the sync ends.
#[test]
fn a_master_whose_log_sync_is_stuck_stops_taking_requests_once_its_next_batch_is_full() {
    let rt = TestRuntime::new(19);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let _m = start_master(&rt, &net, &meta);
        rt.sleep(Duration::from_secs(1)).await;
        let mut cfg = ClientConfig::new("master");
        cfg.rpc_timeout = Duration::from_secs(600);
        cfg.retry_for = Duration::from_secs(600);
        let client = Client::new(rt.clone(), net.clone(), cfg.clone());
        client.mkdir("/d", false).await.unwrap();

        meta.stall();
        // One create whose sync sticks, then enough to fill the next batch.
        let mut pending = vec![spawn_client(&rt, &net, &cfg, |c| async move {
            c.create("/d/first", 3).await
        })];
        rt.sleep(Duration::from_millis(100)).await;
        for i in 0..master::MAX_WAITING {
            pending.push(spawn_client(&rt, &net, &cfg, move |c| async move {
                c.create(&format!("/d/f{i}"), 3).await
            }));
        }
        rt.sleep(Duration::from_secs(2)).await;
        // Taken, the stat of a missing name would be answered at once.
        let missing = client.stat("/nope");
        let wait = rt.sleep(Duration::from_secs(2));
        futures::pin_mut!(missing, wait);
        let r = futures::future::select(missing, wait).await;
        let missing = match r {
            futures::future::Either::Left((r, _)) => {
                panic!("a request taken with the next batch full: {r:?}")
            }
            futures::future::Either::Right((_, missing)) => missing,
        };
        meta.release();
        assert!(matches!(missing.await, Err(FsError::NotFound(_))));
        for p in pending {
            p.await.unwrap().expect("a create, once its sync ends");
        }
        assert_eq!(
            client.list("/d", false).await.unwrap().len(),
            master::MAX_WAITING + 1
        );
    });
}

#[test]
fn concurrent_record_appends_land_whole_and_at_least_once() {
    let rt = TestRuntime::new(11);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let _m = start_master(&rt, &net, &meta);
        let (_disks, _servers) = start_chunkservers(&rt, &net, 3);
        rt.sleep(Duration::from_secs(2)).await;
        let mut cfg = ClientConfig::new("master");
        cfg.rpc_timeout = Duration::from_secs(2);
        cfg.retry_for = Duration::from_secs(60);
        let first = Client::new(rt.clone(), net.clone(), cfg.clone());
        first.create("/log", 3).await.unwrap();
        // Four appenders, 40 records each, sizes up to a fifth of a chunk, so chunks fill
        // and get padded while others append.
        let mut tasks = Vec::new();
        for w in 0..4u8 {
            let client = Client::new(rt.clone(), net.clone(), cfg.clone());
            let (tx, rx) = futures::channel::oneshot::channel();
            tasks.push(rx);
            rt.spawn(async move {
                let mut mine = Vec::new();
                for n in 0..40u8 {
                    let len = 1 + (w as usize * 7919 + n as usize * 104_729) % (CHUNK as usize / 5);
                    let payload = data(len, w.wrapping_mul(50).wrapping_add(n));
                    let at = client.append_record("/log", &payload).await.unwrap();
                    mine.push((at, payload));
                }
                let _ = tx.send(mine);
            });
        }
        let mut acked = Vec::new();
        for t in tasks {
            acked.extend(t.await.expect("appender finished"));
        }
        let records = first.read_records("/log").await.unwrap();
        assert_eq!(
            records.len(),
            acked.len(),
            "each record once (no faults, no retries)"
        );
        let whole = first.read("/log", 0, u64::MAX).await.unwrap();
        for (at, payload) in &acked {
            // Whole, at the offset returned, inside one chunk.
            let r = records
                .iter()
                .find(|r| r.offset == *at)
                .expect("record at its offset");
            assert_eq!(&r.payload, payload);
            let end = at + (tessera_core::record::HEADER + payload.len()) as u64;
            assert_eq!(at / CHUNK, (end - 1) / CHUNK, "a record straddles chunks");
            assert!(end <= whole.len() as u64);
        }
        assert!(
            whole.len() as u64 > 2 * CHUNK,
            "the appends should fill several chunks"
        );
    });
}

/// Files keep the chunk size they were written with when the master restarts with
/// another: reads map offsets to the chunks the data went to, writes land where reads
/// look, and record appends are padded at the file's own chunk ends. Only files created
/// afterwards get the new size.
#[test]
fn a_file_keeps_its_chunk_size_across_a_master_restart_with_another() {
    let rt = TestRuntime::new(13);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let m = start_master(&rt, &net, &meta);
        let (_disks, _servers) = start_chunkservers(&rt, &net, 3);
        rt.sleep(Duration::from_secs(2)).await;
        let mut cfg = ClientConfig::new("master");
        cfg.rpc_timeout = Duration::from_secs(2);
        cfg.retry_for = Duration::from_secs(60);
        let client = Client::new(rt.clone(), net.clone(), cfg.clone());
        client.create("/old", 3).await.unwrap();
        let content = data(CHUNK as usize * 3 + 1000, 1);
        client.write("/old", 0, content.clone()).await.unwrap();
        client.create("/log", 3).await.unwrap();
        let record = |n: u8| data(CHUNK as usize / 5, n);
        let mut acked = Vec::new();
        for n in 0..3 {
            acked.push((client.append_record("/log", &record(n)).await.unwrap(), n));
        }

        // The master comes back with chunks twice as big for new files.
        m.abort();
        net.kill("master");
        meta.crash();
        let _m = start_master_with(&rt, &net, &meta, 2 * CHUNK);
        rt.sleep(Duration::from_secs(3)).await;
        // A fresh client: nothing cached from before the restart.
        let client = Client::new(rt.clone(), net.clone(), cfg);
        assert_eq!(client.chunk_size("/old").await.unwrap(), CHUNK);
        assert_eq!(
            client.read("/old", 0, u64::MAX).await.unwrap(),
            content,
            "a file written before the restart reads back wrong"
        );
        // A write across one of the file's chunk boundaries (after the lease quiet period).
        client
            .write("/old", CHUNK - 5, Bytes::from_static(b"0123456789"))
            .await
            .unwrap();
        let mut want = content.to_vec();
        want[CHUNK as usize - 5..CHUNK as usize + 5].copy_from_slice(b"0123456789");
        assert_eq!(
            client.read("/old", 0, u64::MAX).await.unwrap(),
            Bytes::from(want)
        );
        // Record appends go on filling the file's own chunks: one that does not fit in
        // what is left of a chunk of the file's size moves on to the next.
        for n in 3..12 {
            acked.push((client.append_record("/log", &record(n)).await.unwrap(), n));
        }
        let records = client.read_records("/log").await.unwrap();
        assert_eq!(records.len(), acked.len());
        for (at, n) in &acked {
            let r = records
                .iter()
                .find(|r| r.offset == *at)
                .expect("record at its offset");
            assert_eq!(r.payload, record(*n));
            let end = at + (tessera_core::record::HEADER + r.payload.len()) as u64;
            assert_eq!(at / CHUNK, (end - 1) / CHUNK, "a record straddles chunks");
        }
        assert!(client.stat("/log").await.unwrap().length > 2 * CHUNK);

        // New files get the new size.
        client.create("/new", 3).await.unwrap();
        assert_eq!(client.chunk_size("/new").await.unwrap(), 2 * CHUNK);
        let fresh = data(CHUNK as usize * 3, 2);
        client.write("/new", 0, fresh.clone()).await.unwrap();
        assert_eq!(client.read("/new", 0, u64::MAX).await.unwrap(), fresh);
        assert_eq!(client.stat("/new").await.unwrap().chunk_count, 2);
    });
}

#[test]
fn a_client_with_the_default_retries_rides_out_a_master_restart() {
    let rt = TestRuntime::new(17);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let m = start_master(&rt, &net, &meta);
        let (_disks, _servers) = start_chunkservers(&rt, &net, 3);
        rt.sleep(Duration::from_secs(2)).await;
        // The library's defaults, as the command line uses them.
        let cfg = ClientConfig::new("master");
        let writer = Client::new(rt.clone(), net.clone(), cfg.clone());
        writer.create("/f", 3).await.unwrap();
        let content = data(CHUNK as usize * 2 + 100, 3);
        writer.write("/f", 0, content.clone()).await.unwrap();

        // The master is down for 30 s; meanwhile fresh clients read, stat and write.
        m.abort();
        net.kill("master");
        let reader = Client::new(rt.clone(), net.clone(), cfg.clone());
        let stat = Client::new(rt.clone(), net.clone(), cfg.clone());
        let writer = Client::new(rt.clone(), net.clone(), cfg);
        use futures::channel::oneshot;
        let (rtx, r) = oneshot::channel();
        let (stx, s) = oneshot::channel();
        let (wtx, w) = oneshot::channel();
        rt.spawn(async move {
            let _ = rtx.send(reader.read("/f", 0, u64::MAX).await);
        });
        rt.spawn(async move {
            let _ = stx.send(stat.stat("/f").await);
        });
        rt.spawn(async move {
            let done = writer
                .write("/f", 10, Bytes::from_static(b"written meanwhile"))
                .await;
            let _ = wtx.send(done);
        });
        rt.sleep(Duration::from_secs(30)).await;
        // It comes back knowing no locations: the first reads find no replica listed
        // until the chunkservers have reported, and writes wait out the lease period.
        let _m = start_master(&rt, &net, &meta);
        assert_eq!(r.await.unwrap().expect("the read gave up"), content);
        assert_eq!(
            s.await.unwrap().expect("the stat gave up").length,
            content.len() as u64
        );
        w.await.unwrap().expect("the write gave up");
    });
}

/// The master's checkpoint is built beside its loop: the master answers while it is
/// being built, and when it is written the records it covers go, those logged meanwhile
/// stay, and a restart starts from it with nothing lost.
#[test]
fn a_checkpoint_is_built_beside_the_master_and_a_restart_starts_from_it() {
    use tessera_core::runtime::MetaStore;
    let rt = TestRuntime::new(23);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let mut opts = master_opts(CHUNK);
        opts.checkpoint_delay = Duration::from_secs(20);
        opts.checkpoint_part_bytes = 256;
        let m = start_master_opts(&rt, &net, &meta, opts.clone());
        let (_disks, _servers) = start_chunkservers(&rt, &net, 3);
        rt.sleep(Duration::from_secs(2)).await;
        let client = Client::new(rt.clone(), net.clone(), ClientConfig::new("master"));
        let stored = |prefix: &'static [u8]| {
            let mut store = meta.clone();
            async move { store.scan(prefix).await.unwrap() }
        };
        client.mkdir("/d", false).await.unwrap();
        // Past `checkpoint_every` (20) records: a checkpoint falls due and is being built.
        let started = rt.now();
        for i in 0..40 {
            client.create(&format!("/d/f{i}"), 3).await.unwrap();
        }
        assert!(
            rt.now().saturating_sub(started) < Duration::from_secs(10),
            "the creates were answered while the checkpoint was being built"
        );
        assert!(
            stored(b"checkpoint").await.is_empty(),
            "a checkpoint was written before it could have been built"
        );
        let last = |log: &[(Vec<u8>, Bytes)]| {
            log.iter()
                .map(|(k, _)| u64::from_be_bytes(k[4..].try_into().unwrap()))
                .collect::<Vec<_>>()
        };
        let before = last(&stored(b"log/").await);
        assert!(before.len() > 40, "{before:?}");
        rt.sleep(Duration::from_secs(25)).await;
        let values = stored(b"checkpoint").await;
        let loaded = checkpoint::load(values.clone())
            .unwrap()
            .expect("a checkpoint once built is written");
        // In parts of at most 256 bytes (and a seal), one value each.
        assert!(loaded.parts > 2, "{} parts", loaded.parts);
        assert_eq!(values.len(), 1 + loaded.parts as usize);
        assert!(values.iter().all(|(_, v)| v.len() <= 256 + 32));
        let cp = loaded.checkpoint;
        let after = last(&stored(b"log/").await);
        assert!(
            cp.through_seq >= 20 && after.iter().all(|&s| s > cp.through_seq),
            "the records a checkpoint through {} covers are gone: {after:?}",
            cp.through_seq
        );
        assert!(
            after.first() == Some(&(cp.through_seq + 1)) && after.len() > 10,
            "records logged while it was built stay: checkpoint through {}, log {after:?}",
            cp.through_seq
        );

        // Restarted from the checkpoint and the log after it, with what was not synced
        // lost: every file is there.
        m.abort();
        net.kill("master");
        meta.crash();
        let _m = start_master_opts(&rt, &net, &meta, opts);
        for i in 0..40 {
            client
                .stat(&format!("/d/f{i}"))
                .await
                .unwrap_or_else(|e| panic!("/d/f{i} after the restart: {e}"));
        }
    });
}

/// A store from before checkpoints were built beside the master holds its first record
/// beside a checkpoint that covers it: the master deletes it at start-up (the next
/// checkpoint would otherwise delete every record from the first on, one by one). Its
/// checkpoint, stored whole as before parts, loads; the next is written in parts over
/// it, and a restart starts from that.
#[test]
fn a_record_a_checkpoint_covers_is_deleted_at_start_up() {
    use tessera_core::driver::master::{log_key, seal};
    use tessera_core::pb::log_record::Op;
    use tessera_core::runtime::MetaStore;
    let rt = TestRuntime::new(29);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let mut meta = MemMetaStore::default();
        let rec = |op| pb::LogRecord {
            time_ms: 1,
            token: 0,
            op: Some(op),
        };
        let cp = pb::Checkpoint {
            through_seq: 5,
            next_handle: 1,
            cluster_id: 7,
            ..Default::default()
        };
        meta.write_synced(vec![
            (
                log_key(1),
                Some(seal(&rec(Op::ClusterId(pb::ClusterIdOp {
                    root: None,
                    cluster_id: 7,
                })))),
            ),
            (b"checkpoint".to_vec(), Some(seal(&cp))),
            (
                log_key(6),
                Some(seal(&rec(Op::Mkdir(pb::MkdirOp {
                    perms: None,
                    path: "/a".into(),
                })))),
            ),
        ])
        .await
        .unwrap();
        let mut opts = master_opts(CHUNK);
        opts.checkpoint_part_bytes = 128;
        let m = start_master_opts(&rt, &net, &meta, opts.clone());
        rt.sleep(Duration::from_secs(1)).await;
        let mut store = meta.clone();
        let left: Vec<u64> = store
            .scan(b"log/")
            .await
            .unwrap()
            .iter()
            .map(|(k, _)| u64::from_be_bytes(k[4..].try_into().unwrap()))
            .collect();
        assert_eq!(left.first(), Some(&6), "{left:?}");
        let client = Client::new(rt.clone(), net.clone(), ClientConfig::new("master"));
        client
            .stat("/a")
            .await
            .expect("the record after the checkpoint");

        // Past `checkpoint_every` (20) records: the next checkpoint, in parts.
        for i in 0..25 {
            client.mkdir(&format!("/b{i}"), false).await.unwrap();
        }
        rt.sleep(Duration::from_secs(1)).await;
        let values = store.scan(b"checkpoint").await.unwrap();
        let loaded = checkpoint::load(values).unwrap().unwrap();
        assert!(
            loaded.checkpoint.through_seq > 20 && loaded.parts > 1,
            "through {}, {} parts",
            loaded.checkpoint.through_seq,
            loaded.parts
        );
        m.abort();
        net.kill("master");
        meta.crash();
        let _m = start_master_opts(&rt, &net, &meta, opts);
        for p in ["/a".to_string(), "/b24".into()] {
            client.stat(&p).await.unwrap_or_else(|e| panic!("{p}: {e}"));
        }
    });
}

#[test]
fn same_seed_same_run() {
    fn run(seed: u64) -> (Vec<u64>, u64) {
        let rt = TestRuntime::new(seed);
        let net = MemNet::new(rt.clone());
        let rt2 = rt.clone();
        rt.block_on(async move {
            let rt = rt2;
            let meta = MemMetaStore::default();
            let m = start_master(&rt, &net, &meta);
            let (disks, s) = start_chunkservers(&rt, &net, 5);
            rt.sleep(Duration::from_secs(2)).await;
            let client = Client::new(rt.clone(), net.clone(), ClientConfig::new("master"));
            for i in 0..4 {
                let p = format!("/f{i}");
                client.create(&p, 2).await.unwrap();
                client
                    .write(&p, 0, data(CHUNK as usize / 2, i as u8))
                    .await
                    .unwrap();
            }
            let placement: Vec<u64> = disks.iter().map(|d| d.handles().iter().sum()).collect();
            let now = rt.now().as_millis();
            for h in s {
                h.abort();
            }
            m.abort();
            (placement, now)
        })
    }
    assert_eq!(run(3), run(3));
}

/// A master and three chunkservers, and a client config patient through start-up.
async fn small_cluster(rt: &TestRuntime, net: &MemNet) -> (ClientConfig, Vec<AbortHandle>) {
    let meta = MemMetaStore::default();
    let mut nodes = vec![start_master(rt, net, &meta)];
    nodes.extend(start_chunkservers(rt, net, 3).1);
    rt.sleep(Duration::from_secs(2)).await;
    let mut cfg = ClientConfig::new("master");
    cfg.rpc_timeout = Duration::from_secs(2);
    cfg.retry_for = Duration::from_secs(60);
    (cfg, nodes)
}

/// Runs `work` on a fresh client of its own, as a task; the receiver gets its result.
fn spawn_client<T: Send + 'static, F: std::future::Future<Output = T> + Send + 'static>(
    rt: &TestRuntime,
    net: &MemNet,
    cfg: &ClientConfig,
    work: impl FnOnce(Client<TestRuntime, MemNet>) -> F,
) -> futures::channel::oneshot::Receiver<T> {
    let client = Client::new(rt.clone(), net.clone(), cfg.clone());
    let (tx, rx) = futures::channel::oneshot::channel();
    let fut = work(client);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx
}

#[test]
fn concurrent_plain_appends_each_land_whole() {
    let rt = TestRuntime::new(13);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let (cfg, _nodes) = small_cluster(&rt, &net).await;
        let first = Client::new(rt.clone(), net.clone(), cfg.clone());
        first.create("/log", 3).await.unwrap();
        // Three appenders, five appends each, sizes across chunk boundaries.
        let mut tasks = Vec::new();
        for w in 0..3u8 {
            tasks.push(spawn_client(&rt, &net, &cfg, move |client| async move {
                let mut mine = Vec::new();
                for n in 0..5u8 {
                    let len = 1 + (w as usize * 7919 + n as usize * 104_729) % (CHUNK as usize);
                    let bytes = data(len, w.wrapping_mul(50).wrapping_add(n) | 1);
                    let at = client.append("/log", bytes.clone()).await.unwrap();
                    mine.push((at, bytes));
                }
                mine
            }));
        }
        let mut acked = Vec::new();
        for t in tasks {
            acked.extend(t.await.expect("appender finished"));
        }
        // An empty append changes nothing.
        let total: u64 = acked.iter().map(|(_, b)| b.len() as u64).sum();
        assert_eq!(first.append("/log", Bytes::new()).await.unwrap(), total);
        let whole = first.read("/log", 0, u64::MAX).await.unwrap();
        assert_eq!(
            whole.len() as u64,
            total,
            "the file is exactly the appends, end to end"
        );
        for (at, bytes) in &acked {
            let at = *at as usize;
            assert!(
                whole[at..at + bytes.len()] == bytes[..],
                "the append of {} bytes at {at} was overwritten",
                bytes.len()
            );
        }
        // An appender that reserved its region and died leaves zeros there (across a
        // chunk boundary, where no chunk was ever allocated); later appends go after it.
        let hole = first.reserve_append("/log", CHUNK + 10).await.unwrap();
        assert_eq!(hole, total);
        let at = first
            .append("/log", Bytes::from_static(b"after"))
            .await
            .unwrap();
        assert_eq!(at, total + CHUNK + 10);
        let tail = first.read("/log", total, u64::MAX).await.unwrap();
        assert_eq!(tail.len() as u64, CHUNK + 15);
        assert!(tail[..CHUNK as usize + 10].iter().all(|&b| b == 0));
        assert_eq!(&tail[CHUNK as usize + 10..], b"after");
    });
}

#[test]
fn of_two_puts_to_one_path_a_successful_one_leaves_its_bytes() {
    let rt = TestRuntime::new(17);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let (cfg, _nodes) = small_cluster(&rt, &net).await;
        let first = Client::new(rt.clone(), net.clone(), cfg.clone());
        first.mkdir("/d", false).await.unwrap();
        // The second put starts a little later each round, so it meets the first at
        // every step: its stat, create, writes and rename.
        for (round, delay) in [0u64, 1, 2, 3, 4, 6, 8, 11, 15, 20, 30, 45]
            .iter()
            .enumerate()
        {
            let path = format!("/d/p{round}");
            let mut tasks = Vec::new();
            for w in 0..2u8 {
                let (path, rt2) = (path.clone(), rt.clone());
                let wait = Duration::from_millis(delay * u64::from(w));
                let bytes = data(CHUNK as usize + 1000 * round + 7 * w as usize, w + 1);
                tasks.push(spawn_client(&rt, &net, &cfg, move |client| async move {
                    rt2.sleep(wait).await;
                    let r = client.put(&path, 3, bytes.clone()).await;
                    (r, bytes)
                }));
            }
            let mut winners = 0;
            for t in tasks {
                let (r, bytes) = t.await.expect("put finished");
                match r {
                    Ok(()) => {
                        winners += 1;
                        let got = first.read(&path, 0, u64::MAX).await.unwrap();
                        assert!(
                            got == bytes,
                            "round {round}: a put said it succeeded, but {path} holds other bytes"
                        );
                    }
                    Err(e) => assert!(
                        matches!(e, tessera_core::error::FsError::AlreadyExists(_)),
                        "round {round}: the losing put failed with {e}, not AlreadyExists"
                    ),
                }
            }
            assert_eq!(winners, 1, "round {round}: exactly one put succeeds");
            // Nothing is left behind: no temporary files.
            let names: Vec<String> = first
                .list("/d", false)
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.path)
                .collect();
            let mut want: Vec<String> = (0..=round).map(|i| format!("/d/p{i}")).collect();
            want.sort();
            assert_eq!(names, want, "round {round}");
        }
    });
}

/// A put whose directory is renamed while it writes fails (its file is no longer where
/// it wrote it), and cannot remove its unfinished copy, which went with the directory:
/// its error says so and names the copy, and the copy is there under the new name. The
/// temporary name being the put's own, nothing else could find it.
#[test]
fn a_put_whose_directory_moves_says_what_it_left_behind() {
    let rt = TestRuntime::new(19);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let (cfg, _nodes) = small_cluster(&rt, &net).await;
        let client = Client::new(rt.clone(), net.clone(), cfg.clone());
        client.mkdir("/p", false).await.unwrap();
        let other = Client::new(rt.clone(), net.clone(), cfg);
        let r = client
            .put_with("/p/y", 3, |tmp| {
                let (client, other) = (client.clone(), other.clone());
                async move {
                    client.write(&tmp, 0, data(1000, 1)).await?;
                    other.rename("/p", "/q").await?;
                    client.write(&tmp, 1000, data(1000, 2)).await
                }
            })
            .await;
        let Err(PutError::Left { failed, name }) = r else {
            panic!("the put's error does not say what it left: {r:?}");
        };
        assert!(
            matches!(*failed, PutError::Write(FsError::NotFound(_))),
            "{failed:?}"
        );
        assert!(name.starts_with("y._COPYING_."), "{name}");
        let left: Vec<String> = client
            .list("/q", false)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(left, vec![format!("/q/{name}")]);
        let shown = PutError::Left {
            failed,
            name: name.clone(),
        }
        .to_string();
        assert!(
            shown.contains(&name) && shown.contains("renamed"),
            "{shown}"
        );
    });
}

/// A chunk whose every copy fails its checksums reads as corrupt, not merely missing:
/// the read's error and fsck say how many copies were found corrupt (the read is still
/// retried, as a server holding a good copy may come back).
#[test]
fn a_chunk_whose_every_copy_is_corrupt_is_said_to_be() {
    let rt = TestRuntime::new(23);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let _m = start_master(&rt, &net, &meta);
        let (disks, mut servers) = start_chunkservers(&rt, &net, 3);
        rt.sleep(Duration::from_secs(2)).await;
        let mut cfg = ClientConfig::new("master");
        cfg.rpc_timeout = Duration::from_secs(2);
        cfg.retry_for = Duration::from_secs(60);
        let client = Client::new(rt.clone(), net.clone(), cfg.clone());
        client.put("/f", 3, data(1000, 3)).await.unwrap();
        // Every server restarts (no copy left in a read cache), and every disk's copy
        // has a bit flipped.
        for (i, s) in servers.iter_mut().enumerate() {
            s.abort();
            net.kill(&format!("cs{i}"));
            let h = disks[i].handles()[0];
            disks[i].corrupt(h, 10);
            *s = start_chunkserver(&rt, &net, &disks[i], i);
        }
        rt.sleep(Duration::from_secs(3)).await;
        cfg.retry_for = Duration::from_secs(10);
        let reader = Client::new(rt.clone(), net.clone(), cfg);
        let e = reader.read("/f", 0, u64::MAX).await.unwrap_err();
        assert!(
            matches!(&e, FsError::Unavailable(m) if m.contains("3 of its copies failed their checksums")),
            "{e}"
        );
        let fsck = client.fsck("/f", true).await.unwrap();
        let c = &fsck.files[0].chunks[0];
        assert_eq!((c.replicas.len(), c.corrupt_copies), (0, 3), "{c:?}");
    });
}

/// A short stand-in for a chunk's bytes, so a failed comparison prints readably.
fn digest(data: Option<Vec<u8>>) -> Option<(usize, u64)> {
    data.map(|d| {
        let sum = d.iter().fold(0u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        (d.len(), sum)
    })
}

/// Two clusters on one network. A chunkserver of cluster A, restarted with B's master in
/// its configuration (an operator's slip), is refused by B: B registers nothing, orders
/// nothing, and A's copies on it stay whole. Its chunk handles collide with B's (both
/// clusters number chunks from 1), and one of them is unknown to B: a master that took the
/// server in would order that copy deleted as an orphan.
#[test]
fn a_chunkserver_pointed_at_another_clusters_master_is_refused() {
    let rt = TestRuntime::new(11);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let start = |listen: &str, seed: u64, store: &MemMetaStore| {
            let (handle, reg) = AbortHandle::new_pair();
            let mut opts = master_opts(CHUNK);
            opts.listen = listen.into();
            // Two clusters' masters differ in their seeds, as the binary's do (it seeds
            // from the OS): the cluster id is drawn from it.
            opts.config.rng_seed = seed;
            let fut = master::run(rt.clone(), net.clone(), store.clone(), opts, Quiet);
            rt.spawn(async move {
                if let Ok(Err(e)) = Abortable::new(fut, reg).await {
                    panic!("master stopped: {e}");
                }
            });
            handle
        };
        let (meta_a, meta_b) = (MemMetaStore::default(), MemMetaStore::default());
        let _ma = start("ma", 1, &meta_a);
        let _mb = start("mb", 2, &meta_b);
        let disks_a: Vec<MemChunkStore> = (0..3).map(|_| MemChunkStore::default()).collect();
        let disks_b: Vec<MemChunkStore> = (0..3).map(|_| MemChunkStore::default()).collect();
        let mut servers_a: Vec<AbortHandle> = (0..3)
            .map(|i| start_chunkserver_at(&rt, &net, &disks_a[i], &format!("a{i}"), "ma", i))
            .collect();
        let _servers_b: Vec<AbortHandle> = (0..3)
            .map(|i| start_chunkserver_at(&rt, &net, &disks_b[i], &format!("b{i}"), "mb", i))
            .collect();
        rt.sleep(Duration::from_secs(2)).await;
        let client = |m: &str| {
            let mut cfg = ClientConfig::new(m);
            cfg.rpc_timeout = Duration::from_secs(2);
            cfg.retry_for = Duration::from_secs(60);
            Client::new(rt.clone(), net.clone(), cfg)
        };
        let (ca, cb) = (client("ma"), client("mb"));
        let content_a = data(CHUNK as usize * 2, 1);
        ca.create("/a", 3).await.unwrap();
        ca.write("/a", 0, content_a.clone()).await.unwrap();
        let content_b = data(CHUNK as usize / 2, 2);
        cb.create("/b", 3).await.unwrap();
        cb.write("/b", 0, content_b.clone()).await.unwrap();
        let a0_before: Vec<_> = disks_a[0]
            .handles()
            .into_iter()
            .map(|h| (h, digest(disks_a[0].data(h))))
            .collect();
        assert_eq!(a0_before.len(), 2);

        // a0 restarts with B's master in its configuration, long enough for B to have
        // taken it in, re-replicated, trimmed and collected, were it going to.
        servers_a[0].abort();
        net.kill("a0");
        servers_a[0] = start_chunkserver_at(&rt, &net, &disks_a[0], "a0", "mb", 0);
        rt.sleep(Duration::from_secs(60)).await;
        let report = cb.report().await.unwrap();
        let listed: Vec<&str> = report.servers.iter().map(|s| s.address.as_str()).collect();
        assert_eq!(listed, vec!["b0", "b1", "b2"], "B took in a server of A");
        assert_eq!((report.missing, report.under_replicated), (0, 0));
        assert_eq!(cb.read("/b", 0, u64::MAX).await.unwrap(), content_b);
        let a0_after: Vec<_> = disks_a[0]
            .handles()
            .into_iter()
            .map(|h| (h, digest(disks_a[0].data(h))))
            .collect();
        assert_eq!(a0_after, a0_before, "A's copies on a0 were changed");

        // Back with its own master, a0 is a member as before.
        servers_a[0].abort();
        net.kill("a0");
        servers_a[0] = start_chunkserver_at(&rt, &net, &disks_a[0], "a0", "ma", 0);
        rt.sleep(Duration::from_secs(5)).await;
        let report = ca.report().await.unwrap();
        assert_eq!(report.servers.iter().filter(|s| s.alive).count(), 3);
        assert_eq!((report.missing, report.under_replicated), (0, 0));
        assert_eq!(ca.read("/a", 0, u64::MAX).await.unwrap(), content_a);
    });
}
