//! Traces recorded by the real drivers: a master's replays cleanly, through a restart,
//! and a trace with one recorded effect altered is reported at that record.

use std::time::Duration;

use bytes::Bytes;
use futures::future::{AbortHandle, Abortable};
use tessera_core::chunkserver::ChunkserverConfig;
use tessera_core::client::{Client, ClientConfig};
use tessera_core::driver::{Quiet, chunkserver, master};
use tessera_core::master::MasterConfig;
use tessera_core::pb::{self, trace_record::Kind};
use tessera_core::runtime::Runtime;
use tessera_core::testkit::{MemChunkStore, MemMetaStore, MemNet, TestRuntime};
use tessera_core::trace::recorder::MemSink;
use tessera_core::trace::{self, Recorder, TraceFile, replay};

fn start_master(
    rt: &TestRuntime,
    net: &MemNet,
    store: &MemMetaStore,
    sink: &MemSink,
) -> AbortHandle {
    let (handle, reg) = AbortHandle::new_pair();
    let opts = master::MasterOptions {
        config: MasterConfig {
            chunk_size: 256 * 1024,
            lease_duration: Duration::from_secs(10),
            max_clock_skew: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(3),
            checkpoint_every: 20,
            rng_seed: 99,
            ..MasterConfig::default()
        },
        listen: "master".into(),
        tick: Duration::from_millis(500),
        call_timeout: Duration::from_secs(2),
        checkpoint_delay: Duration::ZERO,
        checkpoint_part_bytes: 0,
    };
    let fut = master::run(
        rt.clone(),
        net.clone(),
        store.clone(),
        opts,
        (Quiet, Recorder::new(sink.clone())),
    );
    rt.spawn(async move {
        if let Ok(Err(e)) = Abortable::new(fut, reg).await {
            panic!("master stopped: {e}");
        }
    });
    handle
}

fn start_chunkserver(rt: &TestRuntime, net: &MemNet, i: usize, sink: Option<&MemSink>) {
    let opts = chunkserver::ChunkserverOptions {
        config: ChunkserverConfig {
            address: format!("cs{i}"),
            rack: format!("rack{}", i % 2),
            capacity_bytes: 1 << 30,
            ..ChunkserverConfig::default()
        },
        master: "master".into(),
        heartbeat_interval: Duration::from_secs(1),
        call_timeout: Duration::from_secs(2),
    };
    let fut = chunkserver::run(
        rt.clone(),
        net.clone(),
        MemChunkStore::default(),
        opts,
        sink.map(|s| Recorder::new(s.clone())),
    );
    rt.spawn(async move {
        if let Err(e) = fut.await {
            panic!("chunkserver stopped: {e}");
        }
    });
}

/// A master and three chunkservers doing a little of everything, the master restarted
/// once: the master's trace and chunkserver 0's.
fn record() -> (Vec<u8>, Vec<u8>) {
    let rt = TestRuntime::new(3);
    let net = MemNet::new(rt.clone());
    let (msink, csink) = (
        MemSink::new("master", "master"),
        MemSink::new("cs0", "chunkserver"),
    );
    let (m2, c2) = (msink.clone(), csink.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let meta = MemMetaStore::default();
        let m = start_master(&rt, &net, &meta, &m2);
        for i in 0..3 {
            start_chunkserver(&rt, &net, i, (i == 0).then_some(&c2));
        }
        rt.sleep(Duration::from_secs(2)).await;
        let mut cfg = ClientConfig::new("master");
        cfg.rpc_timeout = Duration::from_secs(2);
        cfg.retry_for = Duration::from_secs(60);
        let c = Client::new(rt.clone(), net.clone(), cfg);
        c.mkdir("/d", true).await.unwrap();
        c.create("/d/f", 3).await.unwrap();
        let data: Bytes = (0..300_000u32).map(|i| i as u8).collect::<Vec<_>>().into();
        c.write("/d/f", 0, data.clone()).await.unwrap();
        c.append("/d/f", Bytes::from_static(b"tail")).await.unwrap();
        assert_eq!(c.read("/d/f", 0, 300_000).await.unwrap(), data);
        // The master crashes (its unsynced state gone) and starts again.
        m.abort();
        meta.crash();
        let _m = start_master(&rt, &net, &meta, &m2);
        c.rename("/d/f", "/d/g").await.unwrap();
        c.create("/d/log", 3).await.unwrap();
        c.record_append("/d/log", Bytes::from_static(b"one record"))
            .await
            .unwrap();
        assert_eq!(c.read("/d/g", 300_000, 4).await.unwrap(), &b"tail"[..]);
        c.delete("/d/g", false).await.unwrap();
        // A request that does not decode reaches the master's trace too.
        let bad = tessera_core::runtime::Transport::call(
            &net,
            "master",
            tessera_core::auth::ServerRole::Master,
            Bytes::from_static(&[0xff, 0xff, 0xff]).into(),
            rt.now() + Duration::from_secs(1),
        )
        .await
        .unwrap();
        let resp = <pb::MasterResponse as prost::Message>::decode(bad).unwrap();
        assert!(resp.error.unwrap().message.contains("malformed"));
        rt.sleep(Duration::from_secs(3)).await;
    });
    (msink.bytes(), csink.bytes())
}

fn reframe(f: &TraceFile) -> Vec<u8> {
    let mut out = trace::MAGIC.to_vec();
    trace::frame(&f.header, &mut out);
    for r in &f.records {
        trace::frame(r, &mut out);
    }
    out
}

#[test]
fn a_recorded_master_replays_and_an_altered_effect_is_found_at_its_record() {
    let (master, cs0) = record();
    let f = trace::parse("master", &master).unwrap();
    assert!(f.cut.is_none());
    let report = replay::replay(&[("master".into(), f.clone())]);
    assert!(report.divergence.is_none(), "{:#?}", report.divergence);
    assert_eq!(report.runs, 2, "two starts of the master");
    assert!(report.steps > 50, "{} steps", report.steps);
    let malformed = f.records.iter().any(|r| {
        matches!(&r.kind, Some(Kind::Master(s)) if matches!(s.input, Some(pb::trace_master_step::Input::Malformed(_))))
    });
    assert!(malformed, "the malformed request is in the trace");

    // The same trace read back from its bytes, re-framed, replays the same.
    assert_eq!(
        trace::parse("again", &reframe(&f)).unwrap().records,
        f.records
    );

    // Alter one reply in the second run: the replay stops at that record.
    let mut bad = f.clone();
    let at = bad
        .records
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(&r.kind, Some(Kind::Master(s)) if !s.replies.is_empty()))
        .map(|(i, _)| i)
        .nth(40)
        .expect("40 steps with replies");
    let Some(Kind::Master(step)) = &mut bad.records[at].kind else {
        unreachable!()
    };
    let resp = step.replies[0].resp.as_mut().unwrap();
    resp.error = Some(pb::Error {
        code: pb::ErrorCode::Unavailable as i32,
        message: "altered".into(),
        ..Default::default()
    });
    let bad = trace::parse("altered", &reframe(&bad)).unwrap();
    let report = replay::replay(&[("altered".into(), bad)]);
    let d = report.divergence.expect("the altered reply is found");
    assert_eq!(d.record.seq, f.records[at].seq);
    assert!(d.what.starts_with("reply 1 of"), "{}", d.what);
    assert!(d.expected.contains("altered") && !d.actual.contains("altered"));
    assert_eq!(d.before.len(), replay::CONTEXT.min(at));
    assert_eq!(d.before.last().map(|r| r.seq), Some(f.records[at].seq - 1));

    // A log record altered is found too.
    let mut bad = f.clone();
    let at = bad
        .records
        .iter()
        .position(|r| matches!(&r.kind, Some(Kind::Master(s)) if !s.log.is_empty()))
        .unwrap();
    let Some(Kind::Master(step)) = &mut bad.records[at].kind else {
        unreachable!()
    };
    step.log[0].record.as_mut().unwrap().time_ms += 1;
    let d = replay::replay(&[("x".into(), bad)])
        .divergence
        .expect("found");
    assert_eq!(d.record.seq, f.records[at].seq);
    assert!(d.what.starts_with("log record 1 of"), "{}", d.what);

    // A gap (a record missing) stops the run's replay and says so.
    let mut gap = f.clone();
    gap.records.remove(10);
    let report = replay::replay(&[("gap".into(), gap)]);
    assert!(report.divergence.is_none());
    assert!(
        report.notes.iter().any(|n| n.contains("records missing")),
        "{:?}",
        report.notes
    );

    // A chunkserver's trace is read and its runs counted, not replayed.
    let c = trace::parse("cs0", &cs0).unwrap();
    let report = replay::replay(&[("cs0".into(), c)]);
    assert_eq!((report.runs, report.unreplayed_runs), (0, 1));
    assert!(report.unreplayed_steps > 20);
}

/// File data never enters a trace: only its length and CRC.
#[test]
fn a_chunkserver_trace_keeps_no_file_data() {
    let (_, cs0) = record();
    let c = trace::parse("cs0", &cs0).unwrap();
    let mut datas = 0;
    for r in &c.records {
        if let Some(Kind::Chunkserver(s)) = &r.kind {
            if let Some(pb::trace_chunkserver_step::Input::Request(q)) = &s.input {
                let (stripped, d) = trace::record::strip_request(q.req.as_ref().unwrap());
                assert_eq!(&stripped, q.req.as_ref().unwrap(), "data left in a request");
                datas +=
                    usize::from(d.is_some_and(|d| d.len > 0) || q.data.is_some_and(|d| d.len > 0));
            }
            for rep in &s.replies {
                let (stripped, _) = trace::record::strip_response(rep.resp.as_ref().unwrap());
                assert_eq!(
                    &stripped,
                    rep.resp.as_ref().unwrap(),
                    "data left in a reply"
                );
            }
        }
    }
    assert!(datas > 0, "requests with data were seen");
    assert!(cs0.len() < 200_000, "{} bytes of trace", cs0.len());
}
