//! Where new replicas go (GFS §4.2, §4.3): servers with room for a whole chunk first,
//! then servers with below-average disk use, no server above its limit of recent
//! creations while another is below it, and replicas spread across racks whenever there
//! are enough racks. Never two replicas of a chunk on one server.
//!
//! A pure function of the candidates, so it is tested on its own.

use crate::types::HashSet;

use super::chunks::ServerIdx;

#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub idx: ServerIdx,
    pub rack: &'a str,
    pub utilization: f64,
    pub recent_creations: u32,
    /// Bytes free on its disk, as last reported.
    pub free: u64,
}

/// Picks up to `n` servers from `candidates`, none of them in `exclude` and none on a
/// rack already in `used_racks` while a server on another rack is free. A server with
/// less than `room` bytes free (a whole chunk) is picked only when no other is left: a
/// nearly full disk would fail the chunk's writes part way. `tiebreak` orders equally
/// good servers (the master passes seeded random numbers, so load spreads).
pub fn choose(
    candidates: &[Candidate<'_>],
    n: usize,
    exclude: &[ServerIdx],
    used_racks: &[&str],
    creation_limit: u32,
    room: u64,
    tiebreak: &mut dyn FnMut() -> u64,
) -> Vec<ServerIdx> {
    let mut pool: Vec<(bool, bool, bool, u64, &Candidate<'_>)> = Vec::new();
    let avg = if candidates.is_empty() {
        0.0
    } else {
        candidates.iter().map(|c| c.utilization).sum::<f64>() / candidates.len() as f64
    };
    for c in candidates {
        if exclude.contains(&c.idx) || c.utilization >= 1.0 {
            continue;
        }
        let cramped = c.free < room;
        let busy = c.recent_creations >= creation_limit;
        let above_avg = c.utilization > avg;
        pool.push((cramped, busy, above_avg, tiebreak(), c));
    }
    // Best first: room for a chunk, then not busy, then below-average use, then lower
    // use, then the tiebreak.
    pool.sort_by(|a, b| {
        (a.0, a.1, a.2)
            .cmp(&(b.0, b.1, b.2))
            .then(a.4.utilization.total_cmp(&b.4.utilization))
            .then(a.3.cmp(&b.3))
    });
    let mut racks: HashSet<&str> = used_racks.iter().copied().collect();
    let mut chosen = Vec::new();
    // Servers with room, on new racks, then on any; then servers without room, on new
    // racks, then on any. A copy that cannot be written protects nothing, wherever it is.
    for pass in 0..4 {
        for (cramped, _, _, _, c) in &pool {
            if chosen.len() == n {
                return chosen;
            }
            let new_racks_only = pass % 2 == 0;
            if chosen.contains(&c.idx)
                || (pass < 2 && *cramped)
                || (new_racks_only && racks.contains(c.rack))
            {
                continue;
            }
            racks.insert(c.rack);
            chosen.push(c.idx);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    fn cands(spec: &[(u32, &'static str, f64, u32)]) -> Vec<Candidate<'static>> {
        spec.iter()
            .map(|&(idx, rack, utilization, recent_creations)| Candidate {
                idx,
                rack,
                utilization,
                recent_creations,
                free: ((1.0 - utilization) * 100.0) as u64 * GIB,
            })
            .collect()
    }

    #[test]
    fn prefers_empty_disks_and_idle_servers() {
        let c = cands(&[
            (0, "r1", 0.9, 0),
            (1, "r2", 0.1, 0),
            (2, "r3", 0.1, 99),
            (3, "r4", 0.5, 0),
        ]);
        let mut t = || 0;
        assert_eq!(choose(&c, 1, &[], &[], 10, GIB, &mut t), vec![1]);
        assert_eq!(choose(&c, 2, &[1], &[], 10, GIB, &mut t), vec![3, 0]);
    }

    #[test]
    fn full_disks_never_chosen() {
        let c = cands(&[(0, "r1", 1.0, 0), (1, "r1", 0.2, 0)]);
        assert_eq!(choose(&c, 3, &[], &[], 10, GIB, &mut || 0), vec![1]);
    }

    /// A disk without room for a whole chunk is the last choice, even when the servers
    /// with room are busy or fuller than average: a small disk on a big cluster reads as
    /// well used only once it is nearly full.
    #[test]
    fn a_disk_without_room_for_a_chunk_is_picked_last() {
        let mut c = cands(&[
            (0, "r1", 0.5, 99),
            (1, "r2", 0.6, 0),
            (2, "r3", 0.7, 0),
            (3, "r4", 0.2, 0),
        ]);
        c[3].free = GIB / 2;
        let mut t = || 0;
        assert_eq!(choose(&c, 3, &[], &[], 10, GIB, &mut t), vec![1, 2, 0]);
        // Left with no other, it is picked.
        assert_eq!(choose(&c, 4, &[], &[], 10, GIB, &mut t), vec![1, 2, 0, 3]);
        // Even when it is the only server on a rack not used yet.
        let mut c = cands(&[
            (0, "r1", 0.5, 0),
            (1, "r1", 0.5, 0),
            (2, "r2", 0.5, 0),
            (3, "r3", 0.2, 0),
        ]);
        c[3].free = GIB / 2;
        assert_eq!(choose(&c, 3, &[], &[], 10, GIB, &mut t), vec![0, 2, 1]);
    }

    proptest! {
        #[test]
        fn distinct_servers_and_racks_spread(
            servers in proptest::collection::vec((0u8..4, 0.0f64..0.99, 0u32..5), 1..20),
            n in 1usize..6,
            seed in any::<u64>(),
        ) {
            const RACKS: [&str; 4] = ["a", "b", "c", "d"];
            let c: Vec<_> = servers.iter().enumerate().map(|(i, &(r, u, rc))| Candidate {
                idx: i as u32, rack: RACKS[r as usize], utilization: u, recent_creations: rc,
                free: GIB,
            }).collect();
            let mut rng = crate::rng::Rng::new(seed);
            let got = choose(&c, n, &[], &[], 3, GIB, &mut || rng.next_u64());
            let set: HashSet<_> = got.iter().collect();
            prop_assert_eq!(set.len(), got.len(), "a server chosen twice");
            prop_assert_eq!(got.len(), n.min(c.len()));
            let racks_avail: HashSet<_> = c.iter().map(|c| c.rack).collect();
            let racks_used: HashSet<_> = got.iter().map(|&i| c[i as usize].rack).collect();
            prop_assert_eq!(racks_used.len(), got.len().min(racks_avail.len()),
                "replicas share a rack while another rack had room");
        }
    }
}
