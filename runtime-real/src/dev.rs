//! `tessera dev`: a whole cluster in one process on loopback — a master and chunkservers,
//! each with its own data directory under one root, spread over two racks. Ctrl-C stops
//! it (a stop is a crash, and start-up is recovery, so running it again finds the data).

use std::path::PathBuf;

use crate::server::{self, Knobs};

pub async fn run(
    dir: PathBuf,
    chunkservers: usize,
    port: u16,
    knobs: &Knobs,
) -> Result<(), String> {
    if chunkservers == 0 {
        return Err("a cluster needs at least one chunkserver".into());
    }
    knobs.resolve()?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let master = format!("127.0.0.1:{port}");
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (d, m, k) = (dir.join("master"), master.clone(), knobs.clone());
        tasks.spawn(async move { server::run_master(d, m, &k).await });
    }
    for i in 0..chunkservers {
        let p = port
            .checked_add(1 + i as u16)
            .ok_or("port numbers run out; pick a lower --port")?;
        let (d, m, k) = (dir.join(format!("cs{i}")), master.clone(), knobs.clone());
        let listen = format!("127.0.0.1:{p}");
        let rack = format!("rack{}", i % 2);
        tasks.spawn(async move { server::run_chunkserver(d, listen, m, rack, &k).await });
    }
    let root = std::fs::canonicalize(&dir).unwrap_or(dir);
    println!(
        "Tessera dev cluster: master on {master}, {chunkservers} chunkservers on ports {}-{}, data in {}.\n\
         Try, in another shell:\n\
         \x20 tessera mkdir -p /demo\n\
         \x20 tessera put some-file /demo/file\n\
         \x20 tessera ls /demo\n\
         \x20 tessera get /demo/file copy\n\
         (file commands use {master} unless --master or TESSERA_MASTER says otherwise)\n\
         Ctrl-C stops the cluster; run this again and the data is still there.",
        port + 1,
        port + chunkservers as u16,
        root.display()
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
