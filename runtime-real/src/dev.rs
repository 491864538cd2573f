//! `tessera dev`: a whole cluster in one process on loopback — a master and chunkservers,
//! each with its own data directory under one root, spread over two racks. Ctrl-C stops
//! it (a stop is a crash, and start-up is recovery, so running it again finds the data).

use std::path::PathBuf;

use crate::server::{self, Knobs};

/// The master address commands use when given none: a dev cluster's on its default port.
pub const DEFAULT_MASTER: &str = "127.0.0.1:7070";

pub async fn run(
    dir: PathBuf,
    chunkservers: usize,
    masters: usize,
    port: u16,
    knobs: &Knobs,
) -> Result<(), String> {
    if chunkservers == 0 {
        return Err("a cluster needs at least one chunkserver".into());
    }
    if masters == 0 || masters.is_multiple_of(2) {
        return Err("--masters must be odd: 1, 3 or 5 (a majority must be able to agree)".into());
    }
    knobs.resolve()?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let port_at = |i: usize| {
        port.checked_add(i as u16)
            .ok_or("port numbers run out; pick a lower --port")
    };
    let mut addrs = Vec::new();
    for i in 0..masters {
        addrs.push(format!("127.0.0.1:{}", port_at(i)?));
    }
    let master = addrs.join(",");
    let mut tasks = tokio::task::JoinSet::new();
    if masters == 1 {
        let (d, m, k) = (dir.join("master"), master.clone(), knobs.clone());
        tasks.spawn(async move { server::run_master(d, m, &k).await });
    } else {
        let members: std::collections::BTreeMap<u64, String> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u64 + 1, a.clone()))
            .collect();
        // The group forms on the cluster's first start, when no replica has a data
        // directory; later starts recover. Some with and some without is a replica's
        // data lost (or a group started with another --masters): not formed again.
        let have: Vec<bool> = (1..=masters)
            .map(|id| dir.join(format!("master{id}")).join("meta").exists())
            .collect();
        let bootstrap = !have.iter().any(|&h| h);
        if !bootstrap && !have.iter().all(|&h| h) {
            return Err(format!(
                "{} holds data for only some of the {masters} master replicas: a replica's \
                 data is missing, or the cluster was made with another --masters",
                dir.display()
            ));
        }
        for id in 1..=masters as u64 {
            let (d, k, m) = (
                dir.join(format!("master{id}")),
                knobs.clone(),
                members.clone(),
            );
            tasks.spawn(async move { server::run_replica(d, id, m, bootstrap, false, &k).await });
        }
    }
    for i in 0..chunkservers {
        let p = port_at(masters + i)?;
        let (d, m, k) = (dir.join(format!("cs{i}")), master.clone(), knobs.clone());
        let listen = format!("127.0.0.1:{p}");
        let rack = format!("rack{}", i % 2);
        tasks.spawn(async move { server::run_chunkserver(d, listen, m, rack, &k).await });
    }
    let root = std::fs::canonicalize(&dir).unwrap_or(dir);
    let masters_line = if masters == 1 {
        format!("master on {master}")
    } else {
        format!("{masters} master replicas on {master}")
    };
    // Commands find this cluster by themselves only at the address they default to.
    let env = if master == DEFAULT_MASTER {
        String::new()
    } else {
        format!("\x20 export TESSERA_MASTER={master}\n")
    };
    println!(
        "Tessera dev cluster: {masters_line}, {chunkservers} chunkservers on ports {}-{}, data in {}.\n\
         Try, in another shell:\n\
         {env}\
         \x20 tessera mkdir -p /demo\n\
         \x20 tessera put some-file /demo/file\n\
         \x20 tessera ls /demo\n\
         \x20 tessera get /demo/file copy\n\
         \x20 tessera admin masters\n\
         (without --master or TESSERA_MASTER, commands ask {DEFAULT_MASTER})\n\
         Ctrl-C stops the cluster; run this again and the data is still there.",
        port + masters as u16,
        port + (masters + chunkservers) as u16 - 1,
        root.display(),
    );
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {
            println!("stopping");
            Ok(())
        }
        done = tasks.join_next() => match done {
            Some(Ok(Err(e))) => Err(e),
            Some(Err(e)) => Err(format!("a server task failed: {e}")),
            _ => Err("a server stopped".into()),
        }
    }
}
