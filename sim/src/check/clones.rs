//! What the clone-race phase (`crate::clone_race`) watches of one chunk's clones, at
//! the step each happens: the master's orders and the answers it took to them (with the
//! chunk's version it held then), and the rot it injects into a source's disk at the
//! very step that source starts a clone's read of it from disk.

use std::collections::HashMap;

use tessera_core::chunkserver::{self as cs, Chunkserver};
use tessera_core::master::{self as ms, Master};
use tessera_core::pb::{self, chunk_request::Req};

/// A clone order of the watched chunk, as the master sent it.
#[derive(Clone, Debug)]
pub struct Ordered {
    pub master: String,
    pub call: u64,
    pub target: String,
    pub source: String,
    pub version: u64,
    pub at: i64,
}

/// An answer the master took to one of those orders.
#[derive(Clone, Debug)]
pub struct Answered {
    pub target: String,
    /// The version the clone copied.
    pub version: u64,
    /// The chunk's version in the master's table once it took the answer.
    pub master_version: Option<u64>,
    pub ok: bool,
    /// Why not, when not.
    pub error: Option<String>,
    pub at: i64,
}

pub type Flip = Box<dyn Fn(usize, u8) -> bool + Send>;

/// Rot to inject: into the first disk read of the chunk at an offset past its first
/// clone piece (so one piece was copied whole before it) by one of these servers.
pub struct ArmedRot {
    /// Each server's way to flip a bit of the chunk on its disk (byte, bit): whether
    /// there was such a byte.
    pub disks: HashMap<String, Flip>,
    /// Only reads that start at or past this offset.
    pub from: u64,
    /// A pick for the byte and bit flipped in the range read.
    pub pick: u64,
}

/// A clone's store to hold: the first time one of these servers starts storing a
/// clone of the chunk, its disk is stuck for `time` (every operation on it waits).
pub struct ArmedHold {
    pub disks: HashMap<String, Stick>,
    pub time: std::time::Duration,
}

pub type Stick = Box<dyn Fn(std::time::Duration) + Send>;

#[derive(Default)]
pub struct CloneWatch {
    pub handle: u64,
    pub ordered: Vec<Ordered>,
    pub answered: Vec<Answered>,
    pub rot: Option<ArmedRot>,
    /// Where the rot landed: server, byte offset in the chunk.
    pub rotted: Option<(String, u64)>,
    pub hold: Option<ArmedHold>,
    /// Which server's clone store was held, when (true ms), and its disk operation.
    pub held: Option<(String, i64, u64)>,
    /// The held store done: when, whether it succeeded, and the chunk's version in the
    /// masters' tables then.
    pub stored: Option<(i64, bool, Option<u64>)>,
    /// The newest version of the chunk in any master's table, after its last step.
    pub master_version: Option<u64>,
}

impl CloneWatch {
    pub fn new(handle: u64) -> CloneWatch {
        CloneWatch {
            handle,
            ..Default::default()
        }
    }

    /// A master's step: clone orders of the chunk it sent, answers it took.
    pub fn master_step(
        &mut self,
        node: &str,
        t: i64,
        input: &ms::Input,
        effects: &ms::Effects,
        master: &Master,
    ) {
        for call in &effects.calls {
            if let Some(Req::Clone(cl)) = &call.req.req
                && cl.handle == self.handle
            {
                self.ordered.push(Ordered {
                    master: node.to_string(),
                    call: call.id,
                    target: call.to.clone(),
                    source: cl.source.clone(),
                    version: cl.version,
                    at: t,
                });
            }
        }
        if let Some(c) = master.meta().chunks.get(self.handle) {
            self.master_version = self.master_version.max(Some(c.version));
        }
        if let ms::Input::CallResult { id, result } = input
            && let Some(o) = self
                .ordered
                .iter()
                .find(|o| o.master == node && o.call == *id)
        {
            let ok = matches!(result, Ok(pb::ChunkResponse { error: None, .. }));
            let error = match result {
                Ok(pb::ChunkResponse { error: Some(e), .. }) => Some(format!("{e:?}")),
                Ok(_) => None,
                Err(e) => Some(e.to_string()),
            };
            self.answered.push(Answered {
                target: o.target.clone(),
                version: o.version,
                master_version: master.meta().chunks.get(self.handle).map(|c| c.version),
                ok,
                error,
                at: t,
            });
        }
    }

    /// A chunkserver's step: a read of the chunk from disk by an armed server, at or
    /// past the armed offset, has a bit of its range flipped on that disk before the
    /// read runs (the driver runs the step's disk operations after this). Returns the
    /// server and offset flipped.
    pub fn chunkserver_step(
        &mut self,
        node: &str,
        t: i64,
        input: &cs::Input,
        effects: &cs::Effects,
        _server: &Chunkserver,
    ) -> Option<(String, u64)> {
        self.hold_step(node, t, input, effects);
        let armed = self.rot.as_ref()?;
        let disk = armed.disks.get(node)?;
        let cs::Input::Request { req, .. } = input else {
            return None;
        };
        let Some(Req::Read(r)) = &req.req else {
            return None;
        };
        if r.handle != self.handle || r.offset < armed.from {
            return None;
        }
        let (start, len) = effects.store.iter().find_map(|(_, op)| match op {
            cs::StoreOp::Read { handle, ranges } if *handle == self.handle => {
                ranges.first().copied()
            }
            _ => None,
        })?;
        if len == 0 {
            return None;
        }
        let at = start + armed.pick % len;
        if !disk(at as usize, (armed.pick >> 32) as u8) {
            return None;
        }
        self.rot = None;
        self.rotted = Some((node.to_string(), at));
        self.rotted.clone()
    }

    /// A held server's step that starts storing a clone of the chunk sticks its disk;
    /// the step that hears it stored notes when, and the version masters hold then.
    fn hold_step(&mut self, node: &str, t: i64, input: &cs::Input, effects: &cs::Effects) {
        if let (Some((held, _, op)), cs::Input::StoreDone { id, result }) = (&self.held, input)
            && held == node
            && id == op
            && self.stored.is_none()
        {
            self.stored = Some((t, result.is_ok(), self.master_version));
        }
        let Some(hold) = &self.hold else { return };
        let Some(stick) = hold.disks.get(node) else {
            return;
        };
        let storing = effects.store.iter().find(
            |(_, op)| matches!(op, cs::StoreOp::Replace { handle, .. } if *handle == self.handle),
        );
        if let Some((op, _)) = storing {
            stick(hold.time);
            self.hold = None;
            self.held = Some((node.to_string(), t, *op));
        }
    }
}
