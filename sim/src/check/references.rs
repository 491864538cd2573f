//! No live chunk is collected: every chunk a file names is in the master's chunk table.

use tessera_core::master::{Master, Node};

pub fn check(master: &Master) -> Option<String> {
    let meta = master.meta();
    for (path, node) in meta.ns.walk() {
        if let Node::File(f) = node {
            for &h in f.chunks.iter() {
                if meta.chunks.get(h).is_none() {
                    return Some(format!(
                        "{path} names chunk {h}, which the master has collected"
                    ));
                }
            }
        }
    }
    None
}
