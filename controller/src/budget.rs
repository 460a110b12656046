//! The write pacing of NodeResourceTopology objects: a fleet-wide budget of writes a
//! second handed out in turn, and a least interval between two writes of one node.
//!
//! The API server's cost of these objects is one write each, stored and sent to every
//! watcher. A controller that writes each changed node every few seconds writes more
//! the larger the fleet (1.32 writes per scheduled pod at 500 nodes with a 10 s
//! delay); with a budget the writes a second are flat in the fleet's size, and what
//! grows instead is how long a node's object may trail its GPUs, which the reconciler
//! measures (`topodra_controller_nrt_write_lag_seconds`) and docs/controller.md bounds.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// At most one write per `gap` over the whole fleet. Turns are taken in the order
/// they are asked for (tokio's mutex is fair), so a node that waits is never overtaken
/// by one that asked later.
#[derive(Debug)]
pub(crate) struct WriteBudget {
    gap: Duration,
    next: tokio::sync::Mutex<Option<Instant>>,
}

impl WriteBudget {
    /// `per_second` writes a second (validated positive and finite by the flags).
    pub(crate) fn per_second(per_second: f64) -> Self {
        Self {
            gap: Duration::from_secs_f64(1.0 / per_second),
            next: tokio::sync::Mutex::new(None),
        }
    }

    /// Waits for a turn, then runs `take` at it: `take` returns what the turn is
    /// used for, or `None` where nothing needs writing any more (a node whose pods came
    /// and went while it waited), and then the turn passes to the next waiter at once:
    /// only a write costs a turn. An idle budget serves the first write at once: it
    /// does not save turns up, so a burst after a quiet hour is paced as any other.
    pub(crate) async fn turn<T>(&self, take: impl FnOnce() -> Option<T>) -> Option<T> {
        let mut next = self.next.lock().await;
        let now = Instant::now();
        let at = next.map_or(now, |n| n.max(now));
        tokio::time::sleep_until(at).await;
        let taken = take();
        if taken.is_some() {
            *next = Some(at.checked_add(self.gap).unwrap_or(at));
        }
        taken
    }
}

/// The least time between two writes of one node's object, so that a busy node
/// cannot take the fleet's budget from the others.
#[derive(Debug)]
pub(crate) struct NodeInterval {
    interval: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

impl NodeInterval {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// How long the node must still wait before its next write; `None` when it may
    /// write now.
    pub(crate) fn wait(&self, node: &str) -> Option<Duration> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let since = last.get(node)?.elapsed();
        self.interval.checked_sub(since).filter(|d| !d.is_zero())
    }

    /// The node was written now.
    pub(crate) fn wrote(&self, node: &str) {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(node.to_owned(), Instant::now());
    }

    /// The node's object is gone: nothing to space from.
    pub(crate) fn forget(&self, node: &str) {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn turns_are_spaced_by_the_budget_and_an_idle_budget_saves_none() {
        let budget = WriteBudget::per_second(2.0);
        let start = Instant::now();
        for _ in 0..5 {
            budget.turn(|| Some(())).await;
        }
        // The first at once, then one every 500 ms.
        assert_eq!(start.elapsed(), Duration::from_millis(2000));

        tokio::time::sleep(Duration::from_secs(3600)).await;
        let quiet = Instant::now();
        budget.turn(|| Some(())).await;
        budget.turn(|| Some(())).await;
        budget.turn(|| Some(())).await;
        assert_eq!(quiet.elapsed(), Duration::from_millis(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_nothing_was_written_in_costs_nothing() {
        let budget = WriteBudget::per_second(1.0);
        let start = Instant::now();
        assert_eq!(budget.turn(|| Some(1)).await, Some(1));
        // Three turns that found nothing to write: all at once, one second after the
        // write before them.
        for _ in 0..3 {
            assert_eq!(budget.turn(|| None::<u32>).await, None);
        }
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        budget.turn(|| Some(2)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        budget.turn(|| Some(3)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn turns_go_in_the_order_asked() {
        let budget = std::sync::Arc::new(WriteBudget::per_second(1.0));
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4 {
            let (budget, order) = (budget.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                budget.turn(|| Some(())).await;
                order.lock().unwrap().push(i);
            }));
            // Each asks after the one before it.
            tokio::task::yield_now().await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_waits_out_its_interval_and_others_do_not() {
        let spacing = NodeInterval::new(Duration::from_secs(60));
        assert_eq!(spacing.wait("a"), None);
        spacing.wrote("a");
        tokio::time::sleep(Duration::from_secs(45)).await;
        assert_eq!(spacing.wait("a"), Some(Duration::from_secs(15)));
        assert_eq!(spacing.wait("b"), None);
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert_eq!(spacing.wait("a"), None);
        spacing.wrote("a");
        spacing.forget("a");
        assert_eq!(spacing.wait("a"), None);
    }
}
