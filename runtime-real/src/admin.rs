//! How `tessera admin report`, `fsck` and `masters` print what the masters answer.
//! Plain text for a person, one fact per line in the summaries (`name: value`), so a
//! script can pick a line out with grep.

use std::fmt::Write;

use indicatif::HumanBytes;
use tessera_core::pb::{self, ChunkHealth};

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn learning_note(out: &mut String, ms: u64) {
    if ms > 0 {
        let _ = writeln!(
            out,
            "note: the master is still learning replica locations from heartbeats for {:.1} s more; chunks may show as missing that are not",
            ms as f64 / 1000.0
        );
    }
}

pub fn report_text(r: &pb::ClusterReport) -> String {
    let mut out = String::new();
    let live: Vec<_> = r.servers.iter().filter(|s| s.alive).collect();
    let capacity: u64 = live.iter().map(|s| s.capacity_bytes).sum();
    let used: u64 = live.iter().map(|s| s.used_bytes).sum();
    let _ = writeln!(out, "cluster: {:016x}", r.cluster_id);
    let _ = writeln!(out, "live chunkservers: {}", live.len());
    let _ = writeln!(out, "dead chunkservers: {}", r.servers.len() - live.len());
    let _ = writeln!(out, "capacity: {}", HumanBytes(capacity));
    let _ = writeln!(
        out,
        "used: {} ({})",
        HumanBytes(used),
        percent(used, capacity)
    );
    let _ = writeln!(out, "files: {}", r.files);
    let _ = writeln!(out, "chunks: {}", r.chunks);
    let _ = writeln!(out, "chunk size: {}", HumanBytes(r.chunk_size));
    let _ = writeln!(out, "under-replicated chunks: {}", r.under_replicated);
    let _ = writeln!(out, "missing chunks: {}", r.missing);
    let _ = writeln!(out, "over-replicated chunks: {}", r.over_replicated);
    let _ = writeln!(out, "copies awaiting deletion: {}", r.deleting);
    let _ = writeln!(out, "clones running: {}", r.clones_running);
    learning_note(&mut out, r.learning_for_ms);
    if !r.troubled.is_empty() {
        let hs: Vec<String> = r.troubled.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "troubled chunks (missing first): {} (see `tessera admin fsck --list`)",
            hs.join(" ")
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<24} {:<16} {:<10} {:<5} {:>12} {:>12} {:>6} {:>8} {:>10} {:>6}",
        "SERVER", "ID", "RACK", "STATE", "CAPACITY", "USED", "USE%", "CHUNKS", "HEARD", "CLONES"
    );
    for s in &r.servers {
        let _ = writeln!(
            out,
            "{:<24} {:<16} {:<10} {:<5} {:>12} {:>12} {:>6} {:>8} {:>10} {:>6}",
            s.address,
            format!("{:016x}", s.server_id),
            s.rack,
            if s.alive { "live" } else { "dead" },
            HumanBytes(s.capacity_bytes).to_string(),
            HumanBytes(s.used_bytes).to_string(),
            percent(s.used_bytes, s.capacity_bytes),
            s.chunks,
            format!("{:.1}s ago", s.last_heartbeat_ms_ago as f64 / 1000.0),
            s.clones_in_flight,
        );
    }
    out
}

fn health_name(h: ChunkHealth) -> &'static str {
    match h {
        ChunkHealth::Healthy => "healthy",
        ChunkHealth::UnderReplicated => "UNDER-REPLICATED",
        ChunkHealth::Missing => "MISSING",
        ChunkHealth::Empty => "empty (never written)",
        ChunkHealth::OverReplicated => "over-replicated",
    }
}

/// The whole fsck answer: the files listed, then the summary.
pub fn fsck_text(path: &str, r: &pb::FsckResponse) -> String {
    let mut out = fsck_files_text(&r.files, &mut String::new());
    if !r.files.is_empty() {
        out.push('\n');
    }
    out + &fsck_summary_text(path, r)
}

/// The files (and chunks) an fsck page lists, one line each, printed as pages arrive;
/// `last` is the file whose line was printed last (kept from page to page).
pub fn fsck_files_text(files: &[pb::FsckFile], last: &mut String) -> String {
    let mut out = String::new();
    for f in files {
        // The rest of a file the last page ended in has its line printed already, unless
        // that page listed none of its chunks (fsck without --list lists only problems).
        if !(f.continued && *last == f.path) {
            last.clone_from(&f.path);
            let _ = writeln!(
                out,
                "{}{}: {} bytes, {} chunks, replication {}",
                f.path,
                if f.deleted { " (deleted)" } else { "" },
                f.length,
                f.chunk_count,
                f.replication
            );
        }
        for c in &f.chunks {
            let at: Vec<String> = c
                .replicas
                .iter()
                .map(|r| format!("{} ({})", r.address, r.rack))
                .collect();
            let _ = write!(
                out,
                "  chunk {} handle {} version {}: {} {}/{}",
                c.index,
                c.handle,
                c.version,
                health_name(c.health()),
                c.replicas.len(),
                c.goal
            );
            if !at.is_empty() {
                let _ = write!(out, " at {}", at.join(", "));
            }
            if c.corrupt_copies > 0 {
                let _ = write!(
                    out,
                    "; {} {} found corrupt (failed {} checksums) and dropped",
                    c.corrupt_copies,
                    if c.corrupt_copies == 1 {
                        "copy"
                    } else {
                        "copies"
                    },
                    if c.corrupt_copies == 1 {
                        "its"
                    } else {
                        "their"
                    }
                );
            }
            if !c.deleting.is_empty() {
                let _ = write!(
                    out,
                    "; old copies being deleted on {}",
                    c.deleting.join(", ")
                );
            }
            let _ = writeln!(out);
        }
    }
    out
}

/// The summary under the files: status and totals.
pub fn fsck_summary_text(path: &str, r: &pb::FsckResponse) -> String {
    let mut out = String::new();
    // Chunks that want more copies than there are live servers wait for the operator,
    // not for repairs: said so, not "repairing".
    let repairable = r.under_replicated.saturating_sub(r.beyond_servers);
    let status = if r.missing > 0 {
        "MISSING DATA"
    } else if repairable > 0 || r.single_rack > 0 {
        "HEALTHY, REPAIRING"
    } else if r.beyond_servers > 0 {
        "HEALTHY, UNDER-REPLICATED (replication above the live chunkservers)"
    } else {
        "HEALTHY"
    };
    let _ = writeln!(out, "status of {path}: {status}");
    let _ = writeln!(out, "directories: {}", r.dirs);
    let _ = writeln!(out, "files: {}", r.total_files);
    let _ = writeln!(
        out,
        "total size: {} ({} bytes)",
        HumanBytes(r.total_bytes),
        r.total_bytes
    );
    let _ = writeln!(out, "chunks: {}", r.total_chunks);
    let _ = writeln!(out, "healthy chunks: {}", r.healthy);
    let _ = writeln!(out, "under-replicated chunks: {}", r.under_replicated);
    let _ = writeln!(out, "missing chunks: {}", r.missing);
    let _ = writeln!(out, "over-replicated chunks: {}", r.over_replicated);
    let _ = writeln!(out, "empty chunks: {}", r.empty);
    let _ = writeln!(out, "chunks on one rack only: {}", r.single_rack);
    if r.beyond_servers > 0 {
        let _ = writeln!(
            out,
            "{} under-replicated chunks want more copies than the {} live chunkservers \
             (one copy each): they stay so until chunkservers are added or their files' \
             replication is lowered",
            r.beyond_servers, r.live_servers
        );
    }
    learning_note(&mut out, r.learning_for_ms);
    out
}

/// Asks every master replica in `list` (`a,b,c`) for its status, with the addresses the
/// replicas name as members and the list did not (a replica's answer names them all).
pub async fn masters(
    list: &str,
    net: &crate::transport::GrpcTransport,
) -> Vec<(String, Result<pb::ReplicaStatus, String>)> {
    use prost::Message;
    use tessera_core::runtime::{Runtime, Transport};
    let rt = crate::rt::TokioRuntime;
    let mut addrs: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < addrs.len() {
        let addr = addrs[i].clone();
        i += 1;
        let req = pb::MasterRequest {
            req: Some(pb::master_request::Req::ReplicaStatus(pb::Empty {})),
            ..Default::default()
        };
        let deadline = rt.now() + std::time::Duration::from_secs(3);
        let answer = match net
            .call(
                &addr,
                tessera_core::auth::ServerRole::Master,
                req.encode_to_vec().into(),
                deadline,
            )
            .await
        {
            Err(e) => Err(e.to_string()),
            Ok(b) => match pb::MasterResponse::decode(b) {
                Err(e) => Err(format!("malformed answer: {e}")),
                Ok(pb::MasterResponse {
                    resp: Some(pb::master_response::Resp::ReplicaStatus(s)),
                    ..
                }) => Ok(s),
                Ok(pb::MasterResponse { error: Some(e), .. }) => {
                    Err(tessera_core::FsError::from_pb(&e).to_string())
                }
                Ok(other) => Err(format!("unexpected answer {other:?}")),
            },
        };
        if let Ok(s) = &answer {
            for a in s.members.values() {
                if !addrs.contains(a) {
                    addrs.push(a.clone());
                }
            }
        }
        out.push((addr, answer));
    }
    out
}

/// One line per replica: id, address, role, term, commit, applied, and lag (records
/// behind the leader's committed state, 0 on the leader, and how long since the replica
/// last knew its state current).
pub fn masters_text(rows: &[(String, Result<pb::ReplicaStatus, String>)]) -> String {
    let mut out = String::new();
    let leader = rows
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .filter(|s| s.role == "leader")
        .max_by_key(|s| s.term);
    let leader_seq = leader.map(|s| s.seq);
    let _ = writeln!(
        out,
        "{:>3}  {:<22} {:<9} {:>6} {:>9} {:>9} {:>9}  lag",
        "id", "address", "role", "term", "commit", "applied", "record"
    );
    for (addr, r) in rows {
        match r {
            Ok(s) => {
                let role = if s.role == "leader" && !s.serving {
                    "leader*"
                } else {
                    s.role.as_str()
                };
                let records = match leader_seq {
                    Some(l) => format!("{} records", l.saturating_sub(s.seq)),
                    None => "no leader".into(),
                };
                let lag = match s.lag_ms {
                    u64::MAX => format!("{records}, never current"),
                    ms => format!("{records}, current {ms} ms ago"),
                };
                let _ = writeln!(
                    out,
                    "{:>3}  {:<22} {:<9} {:>6} {:>9} {:>9} {:>9}  {lag}",
                    s.id, addr, role, s.term, s.commit, s.applied, s.seq
                );
            }
            Err(e) if e.contains("runs alone") => {
                let _ = writeln!(
                    out,
                    "{:>3}  {addr:<22} a single master, not a group of replicas",
                    "-"
                );
            }
            Err(e) => {
                // An address the caller listed that no replica names as a member (one
                // removed from the group, say).
                let known = rows.iter().any(|(_, r)| {
                    r.as_ref()
                        .is_ok_and(|s| s.members.values().any(|a| a == addr))
                });
                let none = rows.iter().all(|(_, r)| r.is_err());
                // A learner the leader added that does not answer: it stays a learner
                // (and the group's size and majority stay as they were) until it runs.
                let learner = leader.and_then(|l| {
                    l.members
                        .iter()
                        .find(|(id, a)| *a == addr && l.learners.contains(id))
                        .map(|(id, _)| *id)
                });
                let note = match learner {
                    Some(id) => format!(
                        " (learner {id}: it becomes a voter once it runs, started with \
                         --join --id {id}, and holds the log)"
                    ),
                    None if known || none => String::new(),
                    None => " (not a member of the group)".into(),
                };
                let _ = writeln!(out, "{:>3}  {addr:<22} unreachable{note}: {e}", "-");
            }
        }
    }
    if let Some(l) = leader {
        let ids = |v: &[u64]| {
            let v: Vec<String> = v.iter().map(u64::to_string).collect();
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(",")
            }
        };
        let _ = writeln!(
            out,
            "voters: {}; learners (catching up, not yet voting): {}",
            ids(&l.voters),
            ids(&l.learners)
        );
    }
    if rows
        .iter()
        .any(|(_, r)| r.as_ref().is_ok_and(|s| s.role == "leader" && !s.serving))
    {
        let _ = writeln!(
            out,
            "leader*: elected, still applying what earlier leaders committed"
        );
    }
    out
}

/// Why the group, as `rows` show it, takes no mutation now, if it does not: no
/// replica answers, or none leads (and whether a majority of its voters answers).
/// `None` when a leader serves, or the address is a single master's.
pub fn masters_problem(
    list: &str,
    rows: &[(String, Result<pb::ReplicaStatus, String>)],
) -> Option<String> {
    let alone = rows
        .iter()
        .any(|(_, r)| r.as_ref().is_err_and(|e| e.contains("runs alone")));
    let answers: Vec<&pb::ReplicaStatus> =
        rows.iter().filter_map(|(_, r)| r.as_ref().ok()).collect();
    if alone {
        return None;
    }
    if answers.is_empty() {
        return Some(format!("no master replica answers at {list}"));
    }
    if answers.iter().any(|s| s.role == "leader" && s.serving) {
        return None;
    }
    if let Some(l) = answers.iter().find(|s| s.role == "leader") {
        return Some(format!(
            "replica {} was elected in term {} and is still applying what earlier leaders \
             committed: the group takes no change until it serves (ask again shortly)",
            l.id, l.term
        ));
    }
    // The voters as the replica with the highest term knows them.
    let newest = answers
        .iter()
        .max_by_key(|s| (s.term, s.applied))
        .expect("some answered");
    let voters = &newest.voters;
    let up = answers.iter().filter(|s| voters.contains(&s.id)).count();
    let need = voters.len() / 2 + 1;
    // A leader the answering replicas name but that did not answer here: either it and
    // the other silent voters are down (their followers have not yet timed out), or
    // this host cannot reach them. From here the two look alike, so say both.
    let unreached =
        (newest.leader != 0 && answers.iter().all(|s| s.id != newest.leader)).then(|| {
            let at = newest
                .members
                .get(&newest.leader)
                .map_or(String::new(), |a| format!(" at {a}"));
            format!("replica {}{at} (term {})", newest.leader, newest.term)
        });
    Some(match (unreached, up < need) {
        (Some(leader), true) => format!(
            "no replica that answers here leads: {up} of the group's {} voters answer, \
             and electing a leader takes {need}. They still name {leader} as leader, but \
             it did not answer: it and the other silent voters are down (the group takes \
             no change until a majority runs again), or this host cannot reach them",
            voters.len()
        ),
        (Some(leader), false) => format!(
            "{leader} leads, say the replicas that answered, but it did not answer here: \
             this host cannot reach the group's leader"
        ),
        (None, true) => format!(
            "no replica leads: {up} of the group's {} voters answer, and electing a leader \
             takes {need}. The group takes no change (shadows still answer reads, marked \
             stale) until a majority of its replicas run and reach each other",
            voters.len()
        ),
        (None, false) => format!(
            "no replica leads yet: {up} of the group's {} voters answer, enough to elect \
             one; an election is under way, or the replicas that answer here cannot reach \
             each other (ask again shortly)",
            voters.len()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A learner that does not answer is named as one, with what it waits for; an
    /// address no member has is named as no member.
    #[test]
    fn a_learner_that_does_not_answer_is_said_to_be_one() {
        let addr = |i: u64| format!("10.0.0.{i}:7070");
        let status = |id: u64, role: &str| pb::ReplicaStatus {
            id,
            role: role.into(),
            term: 3,
            leader: 1,
            serving: role == "leader",
            members: (1..=4).map(|i| (i, addr(i))).collect(),
            voters: vec![1, 2, 3],
            learners: vec![4],
            ..Default::default()
        };
        let rows = vec![
            (addr(1), Ok(status(1, "leader"))),
            (addr(2), Ok(status(2, "shadow"))),
            (addr(3), Ok(status(3, "shadow"))),
            (addr(4), Err("connection refused".to_string())),
            (addr(9), Err("connection refused".to_string())),
        ];
        let text = masters_text(&rows);
        let line = |a: &str| text.lines().find(|l| l.contains(a)).unwrap().to_string();
        assert!(
            line(&addr(4)).contains(
                "(learner 4: it becomes a voter once it runs, started with --join --id 4"
            ),
            "{text}"
        );
        assert!(
            line(&addr(9)).contains("(not a member of the group)"),
            "{text}"
        );
        assert!(!line(&addr(9)).contains("learner"), "{text}");
        assert!(
            text.contains("learners (catching up, not yet voting): 4"),
            "{text}"
        );
    }

    fn server(addr: &str, alive: bool, chunks: u64) -> pb::ServerReport {
        pb::ServerReport {
            address: addr.into(),
            rack: "rack0".into(),
            alive,
            capacity_bytes: 100 << 30,
            used_bytes: 25 << 30,
            chunks,
            last_heartbeat_ms_ago: if alive { 400 } else { 61_000 },
            clones_in_flight: u32::from(alive),
            server_id: 0x5e5_0000 + chunks,
        }
    }

    #[test]
    fn report_layout() {
        let r = pb::ClusterReport {
            servers: vec![
                server("127.0.0.1:7071", true, 12),
                server("127.0.0.1:7072", false, 0),
            ],
            files: 3,
            chunks: 12,
            under_replicated: 2,
            missing: 1,
            over_replicated: 0,
            clones_running: 1,
            learning_for_ms: 2500,
            chunk_size: 64 << 20,
            troubled: vec![9, 4, 5],
            deleting: 1,
            cluster_id: 0xc1a5_7e55_a11c_e000,
        };
        insta::assert_snapshot!(report_text(&r));
    }

    /// A file that goes on from one page to the next gets its line once, before its first
    /// chunk printed, whichever page that chunk came in.
    #[test]
    fn a_file_over_pages_gets_one_line() {
        let chunk = |index| pb::FsckChunk {
            index,
            handle: 10 + index,
            version: 1,
            goal: 3,
            health: ChunkHealth::Missing.into(),
            ..Default::default()
        };
        let file = |path: &str, continued, chunks: Vec<u64>| pb::FsckFile {
            path: path.into(),
            length: 3 << 26,
            replication: 3,
            chunk_count: 3,
            continued,
            chunks: chunks.into_iter().map(chunk).collect(),
            ..Default::default()
        };
        let pages = [
            vec![file("/a", false, vec![0, 1])],
            vec![file("/a", true, vec![2]), file("/b", false, vec![0])],
            // /c's first page listed none of its chunks (none had a problem).
            vec![file("/c", true, vec![2])],
        ];
        let mut last = String::new();
        let text: String = pages
            .iter()
            .map(|p| fsck_files_text(p, &mut last))
            .collect();
        let lines: Vec<&str> = text.lines().map(|l| l.split(':').next().unwrap()).collect();
        assert_eq!(
            lines,
            [
                "/a",
                "  chunk 0 handle 10 version 1",
                "  chunk 1 handle 11 version 1",
                "  chunk 2 handle 12 version 1",
                "/b",
                "  chunk 0 handle 10 version 1",
                "/c",
                "  chunk 2 handle 12 version 1",
            ],
            "{text}"
        );
    }

    #[test]
    fn fsck_layout() {
        let replica = |a: &str, rack: &str| pb::ReplicaInfo {
            address: a.into(),
            rack: rack.into(),
        };
        let r = pb::FsckResponse {
            files: vec![pb::FsckFile {
                path: "/logs/a".into(),
                length: 70 << 20,
                replication: 3,
                chunk_count: 2,
                deleted: false,
                continued: false,
                chunks: vec![
                    pb::FsckChunk {
                        index: 0,
                        handle: 4,
                        version: 3,
                        goal: 3,
                        health: ChunkHealth::UnderReplicated.into(),
                        replicas: vec![
                            replica("10.0.0.1:7071", "r1"),
                            replica("10.0.0.2:7071", "r2"),
                        ],
                        deleting: vec!["10.0.0.3:7071".into()],
                        corrupt_copies: 0,
                    },
                    pb::FsckChunk {
                        index: 1,
                        handle: 9,
                        version: 1,
                        goal: 3,
                        health: ChunkHealth::Missing.into(),
                        replicas: vec![],
                        deleting: vec![],
                        corrupt_copies: 3,
                    },
                ],
            }],
            dirs: 1,
            total_files: 5,
            total_bytes: 300 << 20,
            total_chunks: 7,
            healthy: 5,
            under_replicated: 1,
            missing: 1,
            empty: 0,
            over_replicated: 0,
            single_rack: 0,
            learning_for_ms: 0,
            chunk_size: 64 << 20,
            next: String::new(),
            next_chunk: 0,
            beyond_servers: 0,
            live_servers: 3,
        };
        insta::assert_snapshot!(fsck_text("/logs", &r));
    }

    /// Chunks that want more copies than there are live chunkservers are said to wait
    /// for the operator, not to be repairing; any other under-replicated chunk is
    /// repairing.
    #[test]
    fn a_replication_above_the_live_servers_is_not_called_repairing() {
        let mut r = pb::FsckResponse {
            total_files: 1,
            total_chunks: 2,
            under_replicated: 2,
            beyond_servers: 2,
            live_servers: 4,
            ..Default::default()
        };
        let text = fsck_summary_text("/", &r);
        assert!(
            text.contains(
                "status of /: HEALTHY, UNDER-REPLICATED (replication above the live chunkservers)"
            ) && text.contains(
                "2 under-replicated chunks want more copies than the 4 live chunkservers"
            ),
            "{text}"
        );
        r.under_replicated = 3;
        let text = fsck_summary_text("/", &r);
        assert!(text.contains("status of /: HEALTHY, REPAIRING"), "{text}");
        r.beyond_servers = 0;
        r.under_replicated = 0;
        let text = fsck_summary_text("/", &r);
        assert!(
            text.contains("status of /: HEALTHY\n") && !text.contains("want more copies"),
            "{text}"
        );
    }

    fn replica(id: u64, role: &str, serving: bool) -> pb::ReplicaStatus {
        pb::ReplicaStatus {
            id,
            role: role.into(),
            term: 4,
            serving,
            voters: vec![1, 2, 3],
            ..Default::default()
        }
    }

    /// `admin masters` fails, saying why, whenever the group takes no change.
    #[test]
    fn a_group_without_a_serving_leader_is_a_problem_said_plainly() {
        let down = |a: &str| (a.to_string(), Err("did not answer".to_string()));
        let up = |a: &str, s| (a.to_string(), Ok(s));
        let rows = vec![
            up("a", replica(1, "leader", true)),
            up("b", replica(2, "shadow", false)),
            down("c"),
        ];
        assert_eq!(masters_problem("a,b,c", &rows), None);
        let rows = vec![
            up("a", replica(1, "candidate", false)),
            down("b"),
            down("c"),
        ];
        let p = masters_problem("a,b,c", &rows).expect("no leader");
        assert!(
            p.contains("1 of the group's 3 voters answer, and electing a leader takes 2"),
            "{p}"
        );
        let rows = vec![
            up("a", replica(1, "shadow", false)),
            up("b", replica(2, "candidate", false)),
            down("c"),
        ];
        let p = masters_problem("a,b,c", &rows).expect("no leader");
        assert!(p.contains("an election is under way"), "{p}");
        let mut named = replica(1, "shadow", false);
        named.leader = 2;
        named.members.insert(2, "b".into());
        let rows = vec![up("a", named.clone()), down("b"), down("c")];
        let p = masters_problem("a,b,c", &rows).expect("no majority, a leader named");
        assert!(
            p.contains("1 of the group's 3 voters answer")
                && p.contains("They still name replica 2 at b (term 4)"),
            "{p}"
        );
        let mut other = named.clone();
        other.id = 3;
        let rows = vec![up("a", named), down("b"), up("c", other)];
        let p = masters_problem("a,b,c", &rows).expect("leader unreachable");
        assert!(
            p.contains("replica 2 at b (term 4) leads") && p.contains("cannot reach"),
            "{p}"
        );
        let rows = vec![up("a", replica(1, "leader", false)), down("b")];
        let p = masters_problem("a,b", &rows).expect("not serving");
        assert!(p.contains("still applying"), "{p}");
        let p = masters_problem("a,b", &[down("a"), down("b")]).expect("none answers");
        assert!(p.contains("no master replica answers at a,b"), "{p}");
        let alone = vec![("a".to_string(), Err("this master runs alone".to_string()))];
        assert_eq!(masters_problem("a", &alone), None);
    }
}
