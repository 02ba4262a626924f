//! The simulator's admin state machine: what the server's metadata group does with its client
//! table (DESIGN.md §4, "the simulator drives it with a small test state machine"), reduced to
//! its rules. An admin group's clients send plain requests — no idempotent producer fields — so
//! a retry after a timeout or a view change may enter the log twice; each node applies the
//! group's committed ops in order, and its [`ClientTable`] decides which of them execute.
//!
//! Its state is the client table alone, so it travels whole: in a snapshot the cluster saves
//! every [`ADMIN_SNAPSHOT_INTERVAL_OPS`] applied ops (the server's metadata snapshots), and in a
//! state transfer, where a peer's machine hands its state to its replica
//! (`Committed::StateWanted`) and the backup's machine becomes it (`Committed::Transferred`).
//!
//! It owns one node's machine and the checks on it: a request executes at most once in the
//! whole run ([`Executions`], shared by every node's machine and every incarnation of it);
//! ops arrive in order with none skipped. It never reads the log or a file itself (the cluster
//! feeds it) and never decides anything in the protocol.

use std::collections::BTreeMap;

use crate::client_table::{ClientCheck, ClientLimits, ClientTable};

/// Sessions an admin machine keeps: every client of a run, so none is ever evicted.
pub(crate) const ADMIN_SESSIONS_MAX: usize = 1_024;

/// Applied ops between two snapshots of an admin machine.
pub(crate) const ADMIN_SNAPSHOT_INTERVAL_OPS: u64 = 16;

/// The run's record of executions, shared by every machine: (client, request) → the op it
/// executed at. Machines that restored a snapshot or a transferred state have no history of
/// their own; this is what their duplicates are checked against.
pub(crate) type Executions = BTreeMap<(u64, u64), u64>;

fn limits() -> ClientLimits {
    ClientLimits { sessions_max: ADMIN_SESSIONS_MAX, reply_bytes_max: 8 }
}

/// One node's admin machine.
#[derive(Clone, Debug)]
pub(crate) struct AdminMachine {
    table: ClientTable,
    /// The op applied last.
    op: u64,
    /// The offset after that op's records.
    end_offset: u64,
    /// The op of the newest snapshot saved (or restored).
    pub(crate) snapshot_op: u64,
    /// Committed retries the table answered without executing them.
    pub(crate) duplicates: u64,
}

impl AdminMachine {
    /// A machine that has applied nothing.
    pub(crate) fn new() -> AdminMachine {
        AdminMachine {
            table: ClientTable::new(limits()),
            op: 0,
            end_offset: 0,
            snapshot_op: 0,
            duplicates: 0,
        }
    }

    /// The machine whose state at `op` (ending at `end_offset`) is `bytes`, from a snapshot or
    /// a transfer.
    pub(crate) fn restore(op: u64, end_offset: u64, bytes: &[u8]) -> Result<AdminMachine, String> {
        let table = ClientTable::decode(bytes, limits())
            .map_err(|error| format!("admin state at op {op} does not decode: {error:?}"))?;
        Ok(AdminMachine { table, op, end_offset, snapshot_op: op, duplicates: 0 })
    }

    /// The state's bytes (what a snapshot or a transfer carries).
    pub(crate) fn encode(&self) -> Vec<u8> {
        self.table.encode()
    }

    /// The op applied last.
    pub(crate) fn op(&self) -> u64 {
        self.op
    }

    /// The offset after the op applied last.
    pub(crate) fn end_offset(&self) -> u64 {
        self.end_offset
    }

    /// Applies committed op `op`, a request of `client` whose records end at `end_offset`. A
    /// client's session is its id, registered at its first op (the server registers it with a
    /// metadata op of its own; the rules after that are the same). An op at or below the one
    /// applied last is already in the state (a snapshot may be ahead of the commit point a
    /// replica recovered with) and is passed over.
    pub(crate) fn apply(
        &mut self,
        (op, end_offset): (u64, u64),
        (client, request): (u64, u64),
        executions: &mut Executions,
    ) -> Result<(), String> {
        if op <= self.op {
            return Ok(());
        }
        if op != self.op + 1 {
            return Err(format!("admin op {op} applied after op {}", self.op));
        }
        self.op = op;
        self.end_offset = end_offset;
        if !self.table.contains(client) {
            self.table.register(client, op);
        }
        match self.table.check(client, request) {
            ClientCheck::New => {
                self.table
                    .apply(client, request, op, &op.to_le_bytes())
                    .map_err(|error| format!("admin op {op}: {error:?}"))?;
                match executions.insert((client, request), op) {
                    Some(first) if first != op => {
                        return Err(format!(
                            "admin request executed twice: client {client} request {request} at \
                             ops {first} and {op}"
                        ));
                    }
                    _ => {}
                }
            }
            ClientCheck::Duplicate(reply) => {
                let original = executions.get(&(client, request)).copied();
                if original.map(u64::to_le_bytes).as_ref().map(|b| &b[..]) != Some(reply) {
                    return Err(format!(
                        "admin op {op}: a retry of client {client} request {request} answered \
                         with a reply that is not its execution's ({original:?})"
                    ));
                }
                self.duplicates += 1;
            }
            // A retry of a request older than the client's newest: it already executed, and
            // its reply is gone.
            ClientCheck::Stale { .. } => {}
            ClientCheck::UnknownSession => {
                return Err(format!("admin op {op}: client {client}'s session vanished"));
            }
        }
        Ok(())
    }

    /// Whether the table holds `client`'s request `request` as executed (it would answer a
    /// retry of it from the table, or refuse it as stale).
    pub(crate) fn knows(&self, client: u64, request: u64) -> bool {
        matches!(
            self.table.check(client, request),
            ClientCheck::Duplicate(_) | ClientCheck::Stale { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(
        machine: &mut AdminMachine,
        op: u64,
        client: u64,
        request: u64,
        executions: &mut Executions,
    ) -> Result<(), String> {
        machine.apply((op, op * 10), (client, request), executions)
    }

    #[test]
    fn a_retry_committed_twice_executes_once_and_ops_arrive_in_order() {
        let (mut machine, mut executions) = (AdminMachine::new(), Executions::new());
        apply(&mut machine, 1, 7, 1, &mut executions).unwrap();
        apply(&mut machine, 2, 7, 1, &mut executions).unwrap();
        apply(&mut machine, 3, 8, 1, &mut executions).unwrap();
        apply(&mut machine, 4, 7, 2, &mut executions).unwrap();
        apply(&mut machine, 5, 7, 1, &mut executions).unwrap();
        assert_eq!(machine.duplicates, 1);
        assert!(machine.knows(7, 1) && machine.knows(7, 2) && machine.knows(8, 1));
        assert!(!machine.knows(8, 2));
        assert_eq!(executions.len(), 3);
        // Already in the state; then a gap.
        apply(&mut machine, 3, 9, 1, &mut executions).unwrap();
        assert!(apply(&mut machine, 7, 7, 3, &mut executions).unwrap_err().contains("after op 5"));
    }

    #[test]
    fn a_restored_machine_answers_retries_of_what_its_source_executed() {
        let (mut source, mut executions) = (AdminMachine::new(), Executions::new());
        apply(&mut source, 1, 7, 1, &mut executions).unwrap();
        apply(&mut source, 2, 8, 1, &mut executions).unwrap();
        let mut restored = AdminMachine::restore(2, 20, &source.encode()).unwrap();
        assert_eq!((restored.op(), restored.end_offset(), restored.snapshot_op), (2, 20, 2));
        apply(&mut restored, 3, 7, 1, &mut executions).unwrap();
        assert_eq!(restored.duplicates, 1, "answered from the transferred table");
        // A machine that lost the table executes the retry again: the shared record sees it.
        let mut blank = AdminMachine { op: 2, ..AdminMachine::new() };
        let error = apply(&mut blank, 3, 7, 1, &mut executions).unwrap_err();
        assert!(error.contains("executed twice"), "{error}");
        assert!(AdminMachine::restore(2, 20, b"junk").is_err());
    }
}
