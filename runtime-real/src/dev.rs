//! `tessera dev`: a whole cluster in one process on loopback — a master and chunkservers,
//! each with its own data directory under one root, spread over two racks. Ctrl-C stops
//! it (a stop is a crash, and start-up is recovery, so running it again finds the data).

use std::path::PathBuf;

use crate::server::{self, Knobs};
use crate::tls::{self, Credentials};
use tessera_core::auth::Caller;

/// The master address commands use when given none: a dev cluster's on its default port.
pub const DEFAULT_MASTER: &str = "127.0.0.1:7070";

/// Whether `dir` holds no master's data yet (a first start), or the data of exactly the
/// masters `--masters` asks for: a master alone keeps it in `master`, a group's replica
/// N in `master<N>`. Anything else is refused rather than started beside: another
/// `--masters` than the cluster was made with would start a new, empty cluster next to
/// the old one (whose chunkservers it would then turn away as another cluster's), and
/// some replicas' data without the others' is data lost, which forming the group again
/// would hide.
pub fn fresh(dir: &std::path::Path, masters: usize) -> Result<bool, String> {
    let mut alone = false;
    let mut replicas = std::collections::BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(rest) = name.strip_prefix("master") else {
                continue;
            };
            if !e.path().join("meta").exists() {
                continue;
            }
            if rest.is_empty() {
                alone = true;
            } else if let Ok(id) = rest.parse::<u64>() {
                replicas.insert(id);
            }
        }
    }
    let shown = dir.display();
    // The --masters that made replicas 1 to n, an odd n above 1; None for any other set
    // (one with a replica lost, or replaced under a new id by `admin masters`).
    let made_with = |ids: &std::collections::BTreeSet<u64>| {
        let n = ids.len();
        (n > 1 && n % 2 == 1 && ids.iter().copied().eq(1..=n as u64)).then_some(n)
    };
    let start_it = |ids: &std::collections::BTreeSet<u64>| match made_with(ids) {
        Some(n) => format!("made with --masters {n}: start it with that"),
        None => "which no --masters starts as it is (a replica lost, or replaced under \
                 a new id): run its replicas with `tessera master`"
            .to_string(),
    };
    let group = |ids: &std::collections::BTreeSet<u64>| {
        ids.iter()
            .map(|id| format!("master{id}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if alone && !replicas.is_empty() {
        return Err(format!(
            "{shown} holds both a master alone's data (master) and a master group's ({}): \
             it is no one cluster's; start each from its own --dir",
            group(&replicas)
        ));
    }
    if masters == 1 {
        if !replicas.is_empty() {
            return Err(format!(
                "{shown} holds a master group's data ({}), {}; or give another --dir for a \
                 new cluster",
                group(&replicas),
                start_it(&replicas)
            ));
        }
        return Ok(!alone);
    }
    if alone {
        return Err(format!(
            "{shown} holds a master alone's data (master), made with --masters 1: start it \
             with that, or give another --dir for a new cluster"
        ));
    }
    let want: std::collections::BTreeSet<u64> = (1..=masters as u64).collect();
    if replicas.is_empty() {
        return Ok(true);
    }
    if replicas == want {
        return Ok(false);
    }
    if replicas.is_subset(&want) {
        let lost: std::collections::BTreeSet<u64> = want.difference(&replicas).copied().collect();
        // Replicas 1 to n of an odd n: most likely a group of n.
        let made = match made_with(&replicas) {
            Some(n) => {
                format!("if the cluster was made with --masters {n}, start it with that; if not, ")
            }
            None => String::new(),
        };
        return Err(format!(
            "{shown} holds the data of {} but none for {}: {made}a replica's data is lost, \
             and forming the group again would hide the loss",
            group(&replicas),
            group(&lost)
        ));
    }
    Err(format!(
        "{shown} holds a master group's data ({}), not that of --masters {masters}, {}; or \
         give another --dir for a new cluster",
        group(&replicas),
        start_it(&replicas)
    ))
}

/// A marker in the default user credentials directory: a dev cluster put them there, so
/// the next one may replace them.
const DEV_MARK: &str = ".made-by-tessera-dev";

/// The dev cluster's authority and credentials, under `dir/certs`: made on its first
/// start, kept after. The admin's are also put where file and admin commands look by
/// default, unless credentials not of a dev cluster are there; returns what to tell.
fn dev_pki(dir: &std::path::Path) -> Result<String, String> {
    let certs = dir.join("certs");
    let ca = certs.join("ca");
    if !ca.join("ca.pem").exists() {
        tls::init_ca(&ca, &format!("dev {}", dir.display())).map_err(|e| e.to_string())?;
    }
    Ok(match tls::default_user_dir() {
        None => format!(
            "credentials: give commands --certs {}",
            certs.join("admin").display()
        ),
        Some(user) => {
            let mark = std::fs::read_to_string(user.join(DEV_MARK)).ok();
            let ours = !user.join("cert.pem").exists() || mark.is_some();
            let this = dir.display().to_string();
            if ours {
                // This cluster's already (a restart): kept as they are. Else made beside
                // and moved in whole, so a command never reads half of them.
                if mark.as_deref() != Some(this.as_str()) || Credentials::load(&user).is_err() {
                    let new = user.with_extension("new");
                    let _ = std::fs::remove_dir_all(&new);
                    let admin = Caller::Admin { name: "dev".into() };
                    tls::issue(&ca, &admin, tls::DEFAULT_DAYS, &new).map_err(|e| e.to_string())?;
                    std::fs::write(new.join(DEV_MARK), &this)
                        .map_err(|e| format!("{}: {e}", new.join(DEV_MARK).display()))?;
                    let _ = std::fs::remove_dir_all(&user);
                    std::fs::rename(&new, &user).map_err(|e| format!("{}: {e}", user.display()))?;
                }
                format!(
                    "an admin's credentials are in {} (commands use them)",
                    user.display()
                )
            } else {
                format!(
                    "{} holds credentials of another cluster, left as they are: give commands \
                     --certs {}",
                    user.display(),
                    certs.join("admin").display()
                )
            }
        }
    })
}

/// The credentials of one of the dev cluster's nodes (or its admin), issued on first
/// use.
fn dev_creds(dir: &std::path::Path, name: &str, who: Caller) -> Result<Credentials, String> {
    let certs = dir.join("certs");
    let out = certs.join(name);
    match Credentials::load(&out) {
        Ok(c) if c.caller == who => return Ok(c),
        Ok(_) => {}
        Err(e) if out.join("cert.pem").exists() => {
            // Expired, or issued by an older Tessera: the dev cluster's authority is its
            // own, so it issues a new one.
            tracing::info!(certs = %out.display(), error = %e, "issuing the dev credentials again");
        }
        Err(_) => {}
    }
    let _ = std::fs::remove_dir_all(&out);
    tls::issue(&certs.join("ca"), &who, tls::DEFAULT_DAYS, &out).map_err(|e| e.to_string())?;
    Credentials::load(&out).map_err(|e| e.to_string())
}

pub async fn run(
    dir: PathBuf,
    chunkservers: usize,
    masters: usize,
    port: u16,
    knobs: &Knobs,
    insecure: bool,
) -> Result<(), String> {
    // Ctrl-C, or a service manager's SIGTERM: a stop as any other (every stop is a crash,
    // and the next start recovers), reported as a success. Watched from the start, so a
    // SIGTERM during start-up is such a stop too (it waits for the select below).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch for SIGTERM: {e}"))?;
    if chunkservers == 0 {
        return Err("a cluster needs at least one chunkserver".into());
    }
    if masters == 0 || masters.is_multiple_of(2) {
        return Err("--masters must be odd: 1, 3 or 5 (a majority must be able to agree)".into());
    }
    knobs.resolve()?;
    // Its authority's key, the cluster secret and every file's bytes live below it.
    crate::server::private_dir(&dir)?;
    let port_at = |i: usize| {
        port.checked_add(i as u16)
            .ok_or("port numbers run out; pick a lower --port")
    };
    let mut addrs = Vec::new();
    for i in 0..masters {
        addrs.push(format!("127.0.0.1:{}", port_at(i)?));
    }
    let master = addrs.join(",");
    // Refused if the directory holds other masters' data; else whether this is the
    // cluster's first start (a group forms then; later starts recover).
    let bootstrap = fresh(&dir, masters)?;
    // Secured as any cluster, by an authority of its own.
    let said = if insecure {
        tracing::warn!(
            "INSECURE: the dev cluster runs with --insecure: anyone who reaches its ports may do anything"
        );
        "no authentication (--insecure): commands need --insecure too".to_string()
    } else {
        dev_pki(&dir)?
    };
    let creds = |name: &str, who: Caller| -> Result<Option<Credentials>, String> {
        if insecure {
            Ok(None)
        } else {
            dev_creds(&dir, name, who).map(Some)
        }
    };
    let mut tasks = tokio::task::JoinSet::new();
    if masters == 1 {
        let (d, m, k) = (dir.join("master"), master.clone(), knobs.clone());
        let c = creds("master", Caller::Master { replica: 1 })?;
        tasks.spawn(async move { server::run_master(d, m, &k, c).await });
    } else {
        let members: std::collections::BTreeMap<u64, String> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u64 + 1, a.clone()))
            .collect();
        for id in 1..=masters as u64 {
            let (d, k, m) = (
                dir.join(format!("master{id}")),
                knobs.clone(),
                members.clone(),
            );
            let c = creds(&format!("master{id}"), Caller::Master { replica: id })?;
            tasks
                .spawn(async move { server::run_replica(d, id, m, bootstrap, false, &k, c).await });
        }
    }
    for i in 0..chunkservers {
        let p = port_at(masters + i)?;
        let (d, m, k) = (dir.join(format!("cs{i}")), master.clone(), knobs.clone());
        let listen = format!("127.0.0.1:{p}");
        let rack = format!("rack{}", i % 2);
        let c = creds(
            &format!("cs{i}"),
            Caller::Chunkserver {
                name: format!("dev-cs{i}"),
            },
        )?;
        tasks.spawn(async move { server::run_chunkserver(d, listen, m, rack, &k, c).await });
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
         (without --master or TESSERA_MASTER, commands ask {DEFAULT_MASTER}; {said})\n\
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
        _ = term.recv() => {
            println!("stopping (SIGTERM)");
            Ok(())
        }
        done = tasks.join_next() => match done {
            Some(Ok(Err(e))) => Err(e),
            Some(Err(e)) => Err(format!("a server task failed: {e}")),
            _ => Err("a server stopped".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fresh;

    fn dir_with(masters: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("temp dir");
        for m in masters {
            std::fs::create_dir_all(d.path().join(m).join("meta")).expect("mkdir");
        }
        d
    }

    #[test]
    fn a_cluster_starts_only_with_the_masters_it_was_made_with() {
        // First starts.
        assert_eq!(fresh(dir_with(&[]).path(), 1), Ok(true));
        assert_eq!(fresh(dir_with(&[]).path(), 3), Ok(true));
        assert_eq!(
            fresh(&std::path::PathBuf::from("/no/such/dir"), 3),
            Ok(true)
        );
        // A chunkserver's directory, or a master's without a store yet, is no master's.
        assert_eq!(fresh(dir_with(&["cs0", "master2x"]).path(), 3), Ok(true));
        let d = dir_with(&[]);
        std::fs::create_dir_all(d.path().join("master1")).expect("mkdir");
        assert_eq!(fresh(d.path(), 3), Ok(true));
        // Later starts, as made.
        assert_eq!(fresh(dir_with(&["master", "cs0"]).path(), 1), Ok(false));
        let three = dir_with(&["master1", "master2", "master3"]);
        assert_eq!(fresh(three.path(), 3), Ok(false));
        // Another --masters than the cluster was made with.
        let e = fresh(three.path(), 1).unwrap_err();
        assert!(e.contains("made with --masters 3"), "{e}");
        let e = fresh(three.path(), 5).unwrap_err();
        assert!(
            e.contains("made with --masters 3") && e.contains("master4, master5"),
            "{e}"
        );
        let e = fresh(dir_with(&["master"]).path(), 3).unwrap_err();
        assert!(e.contains("made with --masters 1"), "{e}");
        let five = dir_with(&["master1", "master2", "master3", "master4", "master5"]);
        let e = fresh(five.path(), 3).unwrap_err();
        assert!(
            e.contains("made with --masters 5: start it with that"),
            "{e}"
        );
        // Replicas a `--masters` count would not name: none suggested.
        let odd = dir_with(&["master1", "master2", "master4"]);
        let e = fresh(odd.path(), 3).unwrap_err();
        assert!(
            e.contains("no --masters starts") && !e.contains("made with"),
            "{e}"
        );
        let e = fresh(dir_with(&["master1", "master3"]).path(), 1).unwrap_err();
        assert!(
            e.contains("no --masters starts") && !e.contains("made with"),
            "{e}"
        );
        // A replica's data lost.
        let e = fresh(dir_with(&["master1", "master3"]).path(), 3).unwrap_err();
        assert!(
            e.contains("none for master2") && !e.contains("made with"),
            "{e}"
        );
        // Two clusters' data in one directory.
        let e = fresh(dir_with(&["master", "master1"]).path(), 1).unwrap_err();
        assert!(e.contains("no one cluster's"), "{e}");
    }
}
