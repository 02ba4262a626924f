//! The simulator's admin state machine: what the server's metadata group does with its client
//! table (DESIGN.md §4, "the simulator drives it with a small test state machine"), reduced to
//! its rules. An admin group's clients send plain requests — no idempotent producer fields — so
//! a retry after a timeout or a view change may enter the log twice; each node applies the
//! group's committed ops in order, and its [`ClientTable`] decides which of them execute.
//!
//! It owns one node's machine and the checks on it: a request executes at most once; ops
//! arrive in order with none skipped. It never reads the log itself (the cluster feeds it) and
//! never decides anything in the protocol.

use std::collections::BTreeMap;

use crate::client_table::{ClientCheck, ClientLimits, ClientTable};

/// Sessions an admin machine keeps: every client of a run, so none is ever evicted.
pub(crate) const ADMIN_SESSIONS_MAX: usize = 1_024;

/// One node's admin machine.
#[derive(Clone, Debug)]
pub(crate) struct AdminMachine {
    table: ClientTable,
    /// The op applied last.
    op: u64,
    /// (client, request) → the op it executed at.
    executed: BTreeMap<(u64, u64), u64>,
    /// Committed retries the table answered without executing them.
    pub(crate) duplicates: u64,
}

impl AdminMachine {
    /// A machine that has applied nothing.
    pub(crate) fn new() -> AdminMachine {
        let limits = ClientLimits { sessions_max: ADMIN_SESSIONS_MAX, reply_bytes_max: 8 };
        AdminMachine {
            table: ClientTable::new(limits),
            op: 0,
            executed: BTreeMap::new(),
            duplicates: 0,
        }
    }

    /// The op applied last.
    pub(crate) fn op(&self) -> u64 {
        self.op
    }

    /// Applies committed op `op`, a request of `client`. A client's session is its id,
    /// registered at its first op (the server registers it with a metadata op of its own; the
    /// rules after that are the same).
    pub(crate) fn apply(&mut self, op: u64, client: u64, request: u64) -> Result<(), String> {
        if op != self.op + 1 {
            return Err(format!("admin op {op} applied after op {}", self.op));
        }
        self.op = op;
        if !self.table.contains(client) {
            self.table.register(client, op);
        }
        match self.table.check(client, request) {
            ClientCheck::New => {
                self.table
                    .apply(client, request, op, &op.to_le_bytes())
                    .map_err(|error| format!("admin op {op}: {error:?}"))?;
                if let Some(first) = self.executed.insert((client, request), op) {
                    return Err(format!(
                        "admin request executed twice: client {client} request {request} at ops \
                         {first} and {op}"
                    ));
                }
            }
            ClientCheck::Duplicate(reply) => {
                let original = self.executed.get(&(client, request)).copied();
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

    /// Whether `client`'s request `request` executed (at an op this machine applied).
    pub(crate) fn executed(&self, client: u64, request: u64) -> bool {
        self.executed.contains_key(&(client, request))
    }

    /// Every execution at or below `op`: (client, request, op), in (client, request) order.
    pub(crate) fn executions_up_to(&self, op: u64) -> Vec<(u64, u64, u64)> {
        self.executed
            .iter()
            .filter(|&(_, &at)| at <= op)
            .map(|(&(client, request), &at)| (client, request, at))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_committed_twice_executes_once_and_ops_arrive_in_order() {
        let mut machine = AdminMachine::new();
        machine.apply(1, 7, 1).unwrap();
        machine.apply(2, 7, 1).unwrap();
        machine.apply(3, 8, 1).unwrap();
        machine.apply(4, 7, 2).unwrap();
        machine.apply(5, 7, 1).unwrap();
        assert_eq!(machine.duplicates, 1);
        assert!(machine.executed(7, 1) && machine.executed(7, 2) && machine.executed(8, 1));
        assert!(machine.apply(7, 7, 3).unwrap_err().contains("after op 5"));
    }
}
