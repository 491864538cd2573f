//! Client workloads. Each client works serially in its own directory: creates files,
//! writes at random offsets (across chunk boundaries, past the end), reads and checks
//! every byte against the model, renames, deletes. Every outcome, success or error,
//! updates the model; every read is judged by it.

use std::time::Duration;

use bytes::Bytes;
use tessera_core::client::Client;
use tessera_core::error::FsError;

use crate::check::Shared;
use crate::check::model::{FileModel, Model};
use crate::net::SimNet;
use crate::runtime::SimRuntime;

#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub ops: usize,
    pub max_files: usize,
    /// Largest write, in bytes.
    pub max_write: u64,
    /// Files grow to at most this many bytes.
    pub max_file: u64,
    /// Pause between operations.
    pub think: Duration,
    /// Share of operations that are deletes (per mille).
    pub delete_permille: u64,
}

type C = Client<SimRuntime, SimNet>;

fn rand() -> u64 {
    madsim::rand::random()
}

/// Bytes no other write produces: client, sequence number and position are mixed in.
fn pattern(client: usize, seq: u64, len: u64) -> Bytes {
    let base = (client as u64).wrapping_mul(0x9E37_79B9) ^ seq.wrapping_mul(0x85EB_CA6B);
    (0..len)
        .map(|i| (base.wrapping_add(i.wrapping_mul(31)) >> 3) as u8)
        .collect::<Vec<_>>()
        .into()
}

pub struct ClientRun {
    pub id: usize,
    pub model: Model,
    pub ok: u64,
    pub errors: u64,
}

fn violation(checks: &Shared, start: madsim::time::Instant, what: String) {
    let t = start.elapsed().as_millis() as i64;
    checks.lock().expect("checks").violation(t, what);
}

/// Runs `w` as client `id`; returns the model of what it left behind.
pub async fn run(
    client: C,
    id: usize,
    w: Workload,
    checks: Shared,
    start: madsim::time::Instant,
) -> ClientRun {
    let dir = format!("/c{id}");
    let mut run = ClientRun {
        id,
        model: Model::default(),
        ok: 0,
        errors: 0,
    };
    // The directory must exist before anything else; retry through faults.
    loop {
        match client.mkdir(&dir, true).await {
            Ok(()) | Err(FsError::AlreadyExists(_)) => break,
            Err(_) => madsim::time::sleep(Duration::from_millis(500)).await,
        }
    }
    for seq in 0..w.ops as u64 {
        madsim::time::sleep(w.think).await;
        let files: Vec<String> = run.model.files.keys().cloned().collect();
        let roll = rand() % 1000;
        if files.is_empty() || (files.len() < w.max_files && roll < 150) {
            let path = format!("{dir}/f{seq}");
            create(&client, &mut run, &path).await;
        } else {
            let path = files[(rand() % files.len() as u64) as usize].clone();
            if roll < 150 + w.delete_permille {
                delete(&client, &mut run, &path).await;
            } else if roll < 200 + w.delete_permille {
                let to = format!("{dir}/r{seq}");
                rename(&client, &mut run, &path, &to).await;
            } else if roll < 600 {
                write(&client, &mut run, &path, seq, &w).await;
            } else {
                read(&client, &mut run, &path, &checks, start).await;
            }
        }
    }
    run
}

async fn create(client: &C, run: &mut ClientRun, path: &str) {
    match client.create(path, 0).await {
        Ok(()) => {
            run.ok += 1;
            run.model
                .files
                .insert(path.to_string(), FileModel::default());
        }
        Err(_) => {
            run.errors += 1;
            // A lost reply may hide a success: ask.
            match client.stat(path).await {
                Ok(_) => {
                    run.model
                        .files
                        .insert(path.to_string(), FileModel::default());
                }
                Err(FsError::NotFound(_)) => {}
                Err(_) => run.model.limbo.push(path.to_string()),
            }
        }
    }
}

async fn delete(client: &C, run: &mut ClientRun, path: &str) {
    match client.delete(path, false).await {
        Ok(()) => {
            run.ok += 1;
            run.model.files.remove(path);
        }
        Err(_) => {
            run.errors += 1;
            match client.stat(path).await {
                Ok(_) => {}
                Err(FsError::NotFound(_)) => {
                    run.model.files.remove(path);
                }
                Err(_) => {
                    run.model.files.remove(path);
                    run.model.limbo.push(path.to_string());
                }
            }
        }
    }
}

async fn rename(client: &C, run: &mut ClientRun, from: &str, to: &str) {
    let result = client.rename(from, to).await;
    let moved = match result {
        Ok(()) => {
            run.ok += 1;
            Some(true)
        }
        Err(_) => {
            run.errors += 1;
            match (client.stat(from).await, client.stat(to).await) {
                (Err(FsError::NotFound(_)), Ok(_)) => Some(true),
                (Ok(_), Err(FsError::NotFound(_))) => Some(false),
                _ => None,
            }
        }
    };
    match moved {
        Some(true) => {
            let f = run
                .model
                .files
                .remove(from)
                .expect("renaming a modelled file");
            run.model.files.insert(to.to_string(), f);
        }
        Some(false) => {}
        None => {
            run.model.files.remove(from);
            run.model.limbo.push(from.to_string());
            run.model.limbo.push(to.to_string());
        }
    }
}

async fn write(client: &C, run: &mut ClientRun, path: &str, seq: u64, w: &Workload) {
    let f = run.model.files.get(path).expect("modelled");
    let room = w.max_file.saturating_sub(1);
    let off = rand() % (f.len_max + w.max_write).min(room).max(1);
    let len = (1 + rand() % w.max_write).min(w.max_file - off).max(1);
    let data = pattern(run.id, seq, len);
    let result = client.write(path, off, data.clone()).await;
    let f = run.model.files.get_mut(path).expect("modelled");
    match result {
        Ok(()) => {
            run.ok += 1;
            f.write_ok(off, &data);
        }
        Err(_) => {
            run.errors += 1;
            f.write_failed(off, &data);
        }
    }
}

async fn read(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let f = run.model.files.get(path).expect("modelled");
    let off = rand() % f.len_max.max(1);
    let len = 1 + rand() % (f.len_max.max(1) * 2);
    match client.read(path, off, len).await {
        Ok(got) => {
            run.ok += 1;
            checks.lock().expect("checks").reads_checked += 1;
            if let Err(e) = f.check_read(off, len, &got) {
                let detail = explain(client, path, off, len, &got, f).await;
                violation(checks, start, format!("{path}: {e}; {detail}"));
            }
        }
        Err(_) => run.errors += 1,
    }
}

/// Retries `op` while it fails, for up to two minutes of simulated time: right after
/// healing, a restarted master grants no lease for one lease period, and locations settle.
async fn patiently<T, F: std::future::Future<Output = Result<T, FsError>>>(
    mut op: impl FnMut() -> F,
) -> Result<T, FsError> {
    let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if madsim::time::Instant::now() >= give_up => return Err(e),
            Err(_) => madsim::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// The liveness check: every modelled file reads back whole and correct, and a fresh
/// write to each succeeds and reads back (leases are granted, clients make progress).
pub async fn verify_all(
    client: &C,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let files: Vec<String> = run.model.files.keys().cloned().collect();
    for (n, path) in files.iter().enumerate() {
        let f = run.model.files[path].clone();
        match patiently(|| client.read(path, 0, u64::MAX)).await {
            Ok(got) => {
                if let Err(e) = f.check_read(0, u64::MAX, &got) {
                    violation(checks, start, format!("after healing, {path}: {e}"));
                }
            }
            Err(e) => violation(
                checks,
                start,
                format!("after healing, {path} cannot be read: {e}"),
            ),
        }
        let data = pattern(run.id, 1_000_000 + n as u64, 100);
        match patiently(|| client.write(path, 0, data.clone())).await {
            Ok(()) => {
                let m = run.model.files.get_mut(path).expect("modelled");
                m.write_ok(0, &data);
                match patiently(|| client.read(path, 0, 100)).await {
                    Ok(got) if got == data => {}
                    Ok(_) => violation(
                        checks,
                        start,
                        format!("after healing, {path}: a fresh write did not read back"),
                    ),
                    Err(e) => violation(
                        checks,
                        start,
                        format!("after healing, {path}: read after write failed: {e}"),
                    ),
                }
            }
            Err(e) => violation(
                checks,
                start,
                format!("after healing, no progress writing {path}: {e}"),
            ),
        }
    }
}

/// For a failed read check: what the master and each replica say about the first bad
/// byte's chunk, so a failure can be understood from the run's output alone.
async fn explain(client: &C, path: &str, off: u64, want: u64, got: &[u8], f: &FileModel) -> String {
    use prost::Message;
    use tessera_core::pb::{
        self, chunk_request::Req as CReq, master_request::Req as MReq, master_response::Resp,
    };
    use tessera_core::runtime::{Runtime, Transport};
    let bad = (0..got.len())
        .find(|&i| f.check_read(off + i as u64, 1, &got[i..=i]).is_err())
        .map_or(off, |i| off + i as u64);
    let (rt, net, master) = client.parts();
    let call = |to: String, body: Vec<u8>| {
        let deadline = rt.now() + Duration::from_secs(2);
        let net = net.clone();
        async move { net.call(&to, body.into(), deadline).await }
    };
    let req = pb::MasterRequest {
        req: Some(MReq::GetChunks(pb::GetChunksRequest {
            path: path.into(),
            first_index: 0,
            count: 0,
        })),
    };
    let Ok(bytes) = call(master.to_string(), req.encode_to_vec()).await else {
        return "master unreachable".into();
    };
    let Ok(pb::MasterResponse {
        resp: Some(Resp::GetChunks(info)),
        ..
    }) = pb::MasterResponse::decode(bytes)
    else {
        return "no locations".into();
    };
    let idx = bad / info.chunk_size;
    let mut out = format!(
        "read {want}@{off} got {}; file_length={} bad byte {bad} in chunk index {idx}",
        got.len(),
        info.file_length
    );
    let Some(c) = info.chunks.iter().find(|c| c.index == idx) else {
        return out + " (no such chunk)";
    };
    out += &format!(
        " handle={} version={} replicas={:?}",
        c.handle, c.version, c.replicas
    );
    for r in &c.replicas {
        let req = pb::ChunkRequest {
            req: Some(CReq::Read(pb::ReadChunkRequest {
                handle: c.handle,
                version: c.version,
                offset: bad % info.chunk_size,
                length: 1,
            })),
        };
        let answer = match call(r.clone(), req.encode_to_vec())
            .await
            .map(pb::ChunkResponse::decode)
        {
            Ok(Ok(pb::ChunkResponse {
                resp: Some(pb::chunk_response::Resp::Read(rd)),
                ..
            })) => format!("len={} byte={:?}", rd.chunk_length, rd.data.first()),
            Ok(Ok(other)) => format!("{:?}", other.error),
            Ok(Err(e)) => format!("decode: {e}"),
            Err(e) => format!("{e}"),
        };
        out += &format!("; {r}: {answer}");
    }
    out
}
