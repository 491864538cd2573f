//! The simulator's `Observer`: every step of every node passes here, and on to the
//! checks of `step.rs` at the step's true time.

use madsim::time::Instant;
use tessera_core::chunkserver::{self as cs, Chunkserver};
use tessera_core::driver::Observer;
use tessera_core::master::{self as ms, Master};
use tessera_core::types::Time;

use super::{Shared, step};
use crate::runtime::{Clock, Jump};

pub struct SimObserver {
    pub node: String,
    pub clock: Clock,
    /// How far the node's clock is stepped now.
    pub jump: Jump,
    pub start: Instant,
    pub checks: Shared,
    /// A master alone's store, whose checkpoint is read back as written.
    pub store: Option<crate::metastore::SimMetaStore>,
}

impl SimObserver {
    fn true_ms(&self) -> i64 {
        self.start.elapsed().as_millis() as i64
    }
}

impl Observer for SimObserver {
    fn master_step(
        &mut self,
        now: Time,
        input: &ms::Input,
        effects: &ms::Effects,
        master: &Master,
    ) {
        let t = self.true_ms();
        let (clock, jump) = (self.clock, self.jump.get());
        let mut c = self.checks.lock().expect("checks lock");
        step::master_step(
            &mut c,
            &self.node,
            t,
            now,
            input,
            effects,
            master,
            |local| clock.true_time(local - jump),
        );
    }

    fn master_started(&mut self, _now: Time, _start: tessera_core::driver::MasterStart<'_>) {
        // A run's checkpoints and owed answers die with it; the next run's come afresh.
        let mut c = self.checks.lock().expect("checks lock");
        c.master_started(&self.node);
    }

    fn master_checkpointed(
        &mut self,
        _now: Time,
        cp: &tessera_core::driver::checkpoint::Sealed,
        logged: u64,
    ) {
        let t = self.true_ms();
        let mut c = self.checks.lock().expect("checks lock");
        let stored = self
            .store
            .as_ref()
            .map(|s| s.durable_under(tessera_core::driver::master::CHECKPOINT_KEY));
        step::master_checkpointed(&mut c, &self.node, t, cp, stored, logged);
    }

    fn replica_step(
        &mut self,
        now: Time,
        input: &tessera_core::group::Input,
        effects: &tessera_core::group::Effects,
        replica: &tessera_core::group::Replica,
    ) {
        let t = self.true_ms();
        let (clock, jump) = (self.clock, self.jump.get());
        let mut c = self.checks.lock().expect("checks lock");
        step::replica_step(
            &mut c,
            &self.node,
            t,
            now,
            input,
            effects,
            replica,
            |local| clock.true_time(local - jump),
        );
    }

    fn chunkserver_step(
        &mut self,
        now: Time,
        input: &cs::Input,
        effects: &cs::Effects,
        server: &Chunkserver,
    ) {
        let t = self.true_ms();
        let (clock, jump) = (self.clock, self.jump.get());
        let mut c = self.checks.lock().expect("checks lock");
        step::chunkserver_step(
            &mut c,
            &self.node,
            t,
            now,
            input,
            effects,
            server,
            |local| clock.true_time(local - jump),
        );
    }
}
