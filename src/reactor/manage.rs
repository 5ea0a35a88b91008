//! The reactor's side of operator changes (`src/admin/manage.rs`): a change goes to the
//! broker with a ticket, and the admin thread's reply channel waits here, keyed by it,
//! until the broker reports the change durable (or failed). Descriptions are answered
//! at once.

use std::sync::mpsc::SyncSender;

use crate::admin::{AdminAnswer, ManageAnswer, ManageAsk};
use crate::broker::Now;

use super::Reactor;

impl Reactor {
    pub(super) fn manage(&mut self, ask: ManageAsk, reply: SyncSender<AdminAnswer>, now: Now) {
        let answer = match ask {
            ManageAsk::Describe { topic } => {
                ManageAnswer::Described(self.broker.describe_topic(&topic))
            }
            ManageAsk::Change(change) => {
                self.next_admin_ticket += 1;
                let ticket = self.next_admin_ticket;
                match self.broker.change(ticket, &change, now) {
                    Ok(()) => {
                        self.admin_waits.insert(ticket, reply);
                        return;
                    }
                    Err(e) => ManageAnswer::Changed(Err(e)),
                }
            }
        };
        // The admin thread may have given up waiting; nothing to do then.
        let _ = reply.send(AdminAnswer::Manage(answer));
    }

    /// Answers the changes the broker finished since the last pass.
    pub(super) fn answer_manage_done(&mut self) {
        for (ticket, result) in self.broker.take_manage_done() {
            if let Some(reply) = self.admin_waits.remove(&ticket) {
                let _ = reply.send(AdminAnswer::Manage(ManageAnswer::Changed(result)));
            }
        }
    }
}
