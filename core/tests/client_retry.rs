//! How long a client keeps trying: each step of an operation for `retry_for`, and an
//! operation as a whole no longer than `Client::until`; the last attempt is made when
//! the time is up, not a whole wait before it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use prost::Message;
use tessera_core::client::{Client, ClientConfig, STILL_TRYING_AFTER};
use tessera_core::error::FsError;
use tessera_core::pb;
use tessera_core::runtime::{PartsReader, Runtime, Transport};
use tessera_core::testkit::{MemNet, TestRuntime};

/// A master at "m" that answers every request "unavailable" (creates aside); counts the
/// requests it had.
fn busy_master(rt: &TestRuntime, net: &MemNet) -> Arc<AtomicU64> {
    let asked = Arc::new(AtomicU64::new(0));
    let (net, count) = (net.clone(), asked.clone());
    rt.spawn(async move {
        let mut inbound = net.listen("m").await.unwrap();
        while let Some(inc) = inbound.next().await {
            count.fetch_add(1, Ordering::Relaxed);
            let req = pb::MasterRequest::decode(PartsReader::from(inc.body)).unwrap();
            let resp = match req.req {
                Some(pb::master_request::Req::Create(_)) => pb::MasterResponse {
                    resp: Some(pb::master_response::Resp::Empty(pb::Empty {})),
                    ..Default::default()
                },
                _ => pb::MasterResponse {
                    error: Some(FsError::Unavailable("busy".into()).to_pb()),
                    ..Default::default()
                },
            };
            let _ = inc.reply.send(resp.encode_to_vec().into());
        }
    });
    asked
}

fn client(rt: &TestRuntime, net: &MemNet, retry_for: Duration) -> Client<TestRuntime, MemNet> {
    let mut cfg = ClientConfig::new("m");
    cfg.retry_for = retry_for;
    Client::new(rt.clone(), net.clone(), cfg)
}

#[test]
fn a_client_tries_for_its_whole_time_and_no_longer() {
    let rt = TestRuntime::new(9);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        let asked = busy_master(&rt, &net);
        // It listens once its task has run.
        rt.sleep(Duration::from_millis(1)).await;
        let secs3 = Duration::from_secs(3);

        // One step: tried until the 3 s are up, the last attempt at their end (waits of
        // 0.1, 0.2, 0.4 and 0.8 s leave 1.5 s, which is the last wait).
        let c = client(&rt, &net, secs3);
        let start = rt.now();
        assert!(matches!(c.stat("/x").await, Err(FsError::Unavailable(_))));
        let took = rt.now().saturating_sub(start);
        assert!(
            took >= secs3 && took < secs3 + Duration::from_millis(50),
            "a stat kept trying for {took:?}"
        );
        assert_eq!(asked.swap(0, Ordering::Relaxed), 6);

        // A command is several operations, each with its own 3 s: a stat and then a
        // mkdir keep trying for 6 s in all...
        let start = rt.now();
        assert!(c.stat("/x").await.is_err() && c.mkdir("/d", false).await.is_err());
        let alone = rt.now().saturating_sub(start);
        assert!(alone >= secs3 * 2, "{alone:?}");
        // ... unless the client's time ends first, as a command's --retry-for does: the
        // mkdir, after it, is tried once.
        let start = rt.now();
        let c = client(&rt, &net, secs3).until(start + secs3);
        assert!(c.stat("/x").await.is_err());
        asked.store(0, Ordering::Relaxed);
        assert!(c.mkdir("/d", false).await.is_err());
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        let took = rt.now().saturating_sub(start);
        assert!(
            took >= secs3 && took < secs3 + Duration::from_millis(50),
            "a stat and a mkdir kept trying for {took:?} (without an end of their own: {alone:?})"
        );
    });
}

/// What the client logs at warning level or above while `body` runs.
fn warnings_of(body: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let out = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || out.clone())
        .finish();
    tracing::subscriber::with_default(sub, body);
    String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned()
}

/// A person at a terminal is told once why nothing happens, a few seconds in; a wait as
/// long as a master group's failover (under two seconds) passes without a word.
#[test]
fn a_client_says_once_that_it_is_still_trying_a_few_seconds_in() {
    for (retry_for, warned) in [(2, 0), (STILL_TRYING_AFTER.as_secs() + 1, 1), (20, 1)] {
        let logged = warnings_of(|| {
            let rt = TestRuntime::new(9);
            let net = MemNet::new(rt.clone());
            let rt2 = rt.clone();
            rt.block_on(async move {
                let rt = rt2;
                busy_master(&rt, &net);
                rt.sleep(Duration::from_millis(1)).await;
                let c = client(&rt, &net, Duration::from_secs(retry_for));
                assert!(c.stat("/x").await.is_err());
            });
        });
        assert_eq!(
            logged.matches("still trying").count(),
            warned,
            "trying for {retry_for} s logged: {logged}"
        );
    }
}

/// A client writing to a file asks the leader where its chunks are, never a shadow: a
/// shadow behind the leader may not have applied the file's create yet, and its "not
/// found" would fail a write to a file that exists (seen from outside: a put during a
/// failover failed with "not found" for the file it had just created). A read may take
/// a shadow's answer.
#[test]
fn a_write_takes_no_shadows_answer_a_read_may() {
    let rt = TestRuntime::new(9);
    let net = MemNet::new(rt.clone());
    let rt2 = rt.clone();
    rt.block_on(async move {
        let rt = rt2;
        // "a" leads but cannot be reached; "b" is a shadow that knows no leader and has
        // not applied the create of anything.
        let net2 = net.clone();
        rt.spawn(async move {
            let mut inbound = net2.listen("b").await.unwrap();
            while let Some(inc) = inbound.next().await {
                let req = pb::MasterRequest::decode(PartsReader::from(inc.body)).unwrap();
                let resp = if req.stale_ok {
                    pb::MasterResponse {
                        error: Some(FsError::NotFound("/f".into()).to_pb()),
                        shadow: Some(pb::ShadowAnswer::default()),
                        ..Default::default()
                    }
                } else {
                    pb::MasterResponse {
                        error: Some(FsError::NotLeader(String::new()).to_pb()),
                        ..Default::default()
                    }
                };
                let _ = inc.reply.send(resp.encode_to_vec().into());
            }
        });
        rt.sleep(Duration::from_millis(1)).await;
        let mut cfg = ClientConfig::new("a,b");
        cfg.retry_for = Duration::from_secs(3);
        let c = Client::new(rt.clone(), net.clone(), cfg);
        let data = bytes::Bytes::from_static(b"hello");
        for (what, got) in [
            ("write", c.write("/f", 0, data.clone()).await.map(|_| ())),
            (
                "record append",
                c.record_append("/f", data.clone()).await.map(|_| ()),
            ),
            ("append", c.append("/f", data.clone()).await.map(|_| ())),
        ] {
            assert!(
                matches!(got, Err(FsError::NotLeader(_) | FsError::Unavailable(_))),
                "a {what} took a shadow's answer: {got:?}"
            );
        }
        // A read is answered by the shadow once the leader could not be reached.
        let got = c.stat("/f").await;
        assert!(matches!(got, Err(FsError::NotFound(_))), "{got:?}");
    });
}
