//! A generic debouncer: merges bursts of events and hands them to one flush at a time.
//!
//! The rules (behaviour.md "Debounce", the reference control plane's loop): the first event of a
//! batch arms a 200 ms timer; when a timer fires and no flush is running, the batch is flushed if
//! the quiet time `after` has passed since its last event or `max` since its first, otherwise the
//! timer is re-armed for the rest of the quiet time. While a flush runs, new events merge into the
//! next batch, which is considered as soon as the flush returns. With `enable: false` every event
//! is flushed on its own, still one flush at a time. When the input closes, whatever is pending is
//! flushed at once and the loop returns after the last flush, which makes graceful shutdown lossless.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use clap::ArgAction;
use dubbo_cp_kit::duration::{self, DurationArg};
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

/// The first timer of a batch, hard-coded in the reference control plane.
pub const FIRST_TIMER: Duration = Duration::from_millis(200);
/// With debouncing off, events waiting behind a running flush, at most; beyond it new events
/// merge into the last waiting one, so a slow flush cannot make the queue grow without bound.
pub const MAX_WAITING_UNMERGED: usize = 64;

/// Events that can be folded into one; merging must lose nothing.
pub trait Merge {
    fn merge(&mut self, other: Self);
}

/// Registrations merge as a union per key (the domain's own merge).
impl Merge for dubbo_cp_domain::mapping::MappingDelta {
    fn merge(&mut self, other: Self) {
        dubbo_cp_domain::mapping::MappingDelta::merge(self, other);
    }
}

/// What a flush receives: the merged value and how it came about.
#[derive(Debug)]
pub struct Batch<T> {
    pub value: T,
    /// How many events were merged into `value`.
    pub events: usize,
    /// When the first of them arrived.
    pub first_event: Instant,
}

/// Runs until `input` is closed and everything received has been flushed.
pub async fn run<T, F, Fut>(config: DebounceConfig, mut input: mpsc::Receiver<T>, mut flush: F)
where
    T: Merge,
    F: FnMut(Batch<T>) -> Fut,
    Fut: Future<Output = ()>,
{
    // With debouncing enabled this holds at most one (merged) batch.
    let mut pending: VecDeque<Batch<T>> = VecDeque::new();
    let mut last_event = Instant::now();
    let mut timer: Option<Instant> = None;
    let mut in_flight: Option<Pin<Box<Fut>>> = None;
    let mut input_open = true;

    loop {
        if in_flight.is_none() {
            let ready = if !input_open || !config.enable {
                pending.pop_front()
            } else {
                None
            };
            match ready {
                Some(batch) => in_flight = Some(Box::pin(flush(batch))),
                None if !input_open => return,
                None => {}
            }
        }

        tokio::select! {
            biased;
            () = wait_for(&mut in_flight) => {
                in_flight = None;
                if config.enable {
                    in_flight = due_flush(&config, &mut pending, last_event, &mut timer, &mut flush);
                }
            }
            () = sleep_until(timer), if timer.is_some() => {
                timer = None;
                if in_flight.is_none() {
                    in_flight = due_flush(&config, &mut pending, last_event, &mut timer, &mut flush);
                }
            }
            event = input.recv(), if input_open => match event {
                None => input_open = false,
                Some(value) => {
                    let now = Instant::now();
                    last_event = now;
                    let pending_len = pending.len();
                    match pending.back_mut() {
                        Some(batch) if config.enable || pending_len >= MAX_WAITING_UNMERGED => {
                            batch.value.merge(value);
                            batch.events += 1;
                        }
                        _ => {
                            if config.enable {
                                timer = Some(now + FIRST_TIMER);
                            }
                            pending.push_back(Batch { value, events: 1, first_event: now });
                        }
                    }
                }
            },
        }
    }
}

/// Starts the pending batch's flush if it is due; otherwise re-arms the timer for the rest of the
/// quiet time.
fn due_flush<T, F, Fut>(
    config: &DebounceConfig,
    pending: &mut VecDeque<Batch<T>>,
    last_event: Instant,
    timer: &mut Option<Instant>,
    flush: &mut F,
) -> Option<Pin<Box<Fut>>>
where
    F: FnMut(Batch<T>) -> Fut,
{
    let first_event = pending.front()?.first_event;
    let now = Instant::now();
    if now - first_event >= config.max || now - last_event >= config.after {
        *timer = None;
        pending.pop_front().map(|batch| Box::pin(flush(batch)))
    } else {
        *timer = Some(last_event + config.after);
        None
    }
}

async fn wait_for<Fut: Future<Output = ()>>(in_flight: &mut Option<Pin<Box<Fut>>>) {
    match in_flight {
        Some(flush) => flush.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The debounce loop of every source (this crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::Args, SmartDefault)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct DebounceConfig {
    /// Debounce on; `false` flushes every change on its own (still one flush at a time).
    #[arg(id = "debounce.enable", long = "debounce-enable", env = "DUBBO_CP_DEBOUNCE_ENABLE",
          action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    #[default(true)]
    pub enable: bool,
    /// Quiet time after the last change before a flush.
    #[arg(id = "debounce.after", long = "debounce-after", env = "DUBBO_CP_DEBOUNCE_AFTER",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_millis(100))]
    pub after: Duration,
    /// Longest delay of a flush after the first change of a batch.
    #[arg(id = "debounce.max", long = "debounce-max", env = "DUBBO_CP_DEBOUNCE_MAX",
          value_parser = DurationArg)]
    #[serde(with = "duration")]
    #[default(Duration::from_secs(10))]
    pub max: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Debug, Clone, PartialEq)]
    struct Events(Vec<u32>);

    impl Merge for Events {
        fn merge(&mut self, other: Self) {
            self.0.extend(other.0);
        }
    }

    /// One recorded flush: when it started (ms after the test began) and what it carried.
    #[derive(Debug, Clone, PartialEq)]
    struct Flushed {
        at_ms: u128,
        values: Vec<u32>,
        events: usize,
    }

    struct Harness {
        tx: mpsc::Sender<Events>,
        flushed: Arc<Mutex<Vec<Flushed>>>,
        max_concurrent: Arc<Mutex<(usize, usize)>>,
        task: tokio::task::JoinHandle<()>,
        start: Instant,
    }

    /// Starts a debouncer whose flush takes `flush_time` and records what it saw.
    fn start(config: DebounceConfig, flush_time: Duration) -> Harness {
        let (tx, rx) = mpsc::channel(1024);
        let flushed = Arc::new(Mutex::new(Vec::new()));
        let max_concurrent = Arc::new(Mutex::new((0, 0)));
        let start = Instant::now();
        let (rec, conc) = (flushed.clone(), max_concurrent.clone());
        let task = tokio::spawn(run(config, rx, move |batch: Batch<Events>| {
            let (rec, conc) = (rec.clone(), conc.clone());
            async move {
                {
                    let mut c = conc.lock().unwrap_or_else(|e| e.into_inner());
                    c.0 += 1;
                    c.1 = c.1.max(c.0);
                }
                rec.lock().unwrap_or_else(|e| e.into_inner()).push(Flushed {
                    at_ms: (Instant::now() - start).as_millis(),
                    values: batch.value.0,
                    events: batch.events,
                });
                tokio::time::sleep(flush_time).await;
                conc.lock().unwrap_or_else(|e| e.into_inner()).0 -= 1;
            }
        }));
        Harness {
            tx,
            flushed,
            max_concurrent,
            task,
            start,
        }
    }

    impl Harness {
        async fn send(&self, v: u32) {
            assert!(self.tx.send(Events(vec![v])).await.is_ok());
        }
        async fn at(&self, ms: u64) {
            tokio::time::sleep_until(self.start + Duration::from_millis(ms)).await;
        }
        fn flushed(&self) -> Vec<Flushed> {
            self.flushed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        }
        fn max_concurrent(&self) -> usize {
            self.max_concurrent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .1
        }
        async fn finish(self) -> Vec<Flushed> {
            let Harness {
                tx, flushed, task, ..
            } = self;
            drop(tx);
            assert!(task.await.is_ok());
            flushed.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
    }

    fn cfg(after_ms: u64, max_ms: u64) -> DebounceConfig {
        DebounceConfig {
            after: Duration::from_millis(after_ms),
            max: Duration::from_millis(max_ms),
            enable: true,
        }
    }

    fn f(at_ms: u128, values: &[u32]) -> Flushed {
        Flushed {
            at_ms,
            values: values.to_vec(),
            events: values.len(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn single_event_waits_for_the_first_timer() {
        let h = start(cfg(100, 10_000), Duration::ZERO);
        h.send(1).await;
        h.at(199).await;
        assert!(
            h.flushed().is_empty(),
            "flushed before the 200 ms first timer"
        );
        h.at(201).await;
        assert_eq!(h.flushed(), vec![f(200, &[1])]);
    }

    #[tokio::test(start_paused = true)]
    async fn quiet_time_flush_after_the_last_event() {
        let h = start(cfg(100, 10_000), Duration::ZERO);
        // Events every 30 ms until 300 ms (no event coincides with a timer): the batch stays noisy
        // until 400 ms.
        for t in (0..=300).step_by(30) {
            h.at(t).await;
            h.send(t as u32).await;
        }
        h.at(399).await;
        assert!(h.flushed().is_empty());
        h.at(401).await;
        let expected: Vec<u32> = (0..=300).step_by(30).collect();
        assert_eq!(h.flushed(), vec![f(400, &expected)]);
    }

    #[tokio::test(start_paused = true)]
    async fn long_quiet_time_rearms_the_timer() {
        let h = start(cfg(500, 10_000), Duration::ZERO);
        h.send(1).await;
        h.at(300).await;
        assert!(
            h.flushed().is_empty(),
            "200 ms first timer must not flush before `after`"
        );
        h.at(501).await;
        assert_eq!(h.flushed(), vec![f(500, &[1])]);
    }

    #[tokio::test(start_paused = true)]
    async fn max_delay_flushes_under_continuous_input() {
        let h = start(cfg(100, 1_000), Duration::ZERO);
        // An event every 30 ms for 2.5 s never leaves 100 ms of quiet.
        for t in (0..2_500).step_by(30) {
            h.at(t).await;
            h.send(t as u32).await;
        }
        h.at(2_700).await;
        let flushed = h.finish().await;
        let times: Vec<u128> = flushed.iter().map(|f| f.at_ms).collect();
        // Each re-armed timer finds the batch noisy until `max` (1 s after its first event) forces
        // the flush; the last batch ends by quiet time 100 ms after the last event (2,490 ms).
        assert_eq!(times, vec![1_000, 2_020, 2_590], "{flushed:?}");
        let all: Vec<u32> = flushed.iter().flat_map(|f| f.values.clone()).collect();
        let expected: Vec<u32> = (0..2_500).step_by(30).collect();
        assert_eq!(all, expected, "no event lost or reordered");
    }

    #[tokio::test(start_paused = true)]
    async fn one_flush_at_a_time_and_events_during_a_flush_merge_into_the_next() {
        // Each flush takes 1 s.
        let h = start(cfg(100, 10_000), Duration::from_secs(1));
        h.send(1).await;
        h.at(300).await; // first flush started at 200 ms and runs until 1.2 s
        for (t, v) in [(300, 2), (420, 3), (530, 4)] {
            h.at(t).await;
            h.send(v).await;
        }
        h.at(1_199).await;
        assert_eq!(
            h.flushed().len(),
            1,
            "a second flush started while the first ran"
        );
        h.at(1_250).await;
        // The waiting batch was quiet long enough, so it goes as soon as the first flush returns.
        assert_eq!(h.flushed(), vec![f(200, &[1]), f(1_200, &[2, 3, 4])]);
        assert_eq!(h.max_concurrent(), 1);
        h.finish().await;
    }

    #[tokio::test(start_paused = true)]
    async fn batch_waiting_on_a_flush_still_honours_quiet_time() {
        let h = start(cfg(100, 10_000), Duration::from_millis(500));
        h.send(1).await; // flushed at 200, running until 700
        h.at(650).await;
        h.send(2).await; // quiet until 750
        h.at(760).await;
        assert_eq!(h.flushed(), vec![f(200, &[1]), f(750, &[2])]);
        h.finish().await;
    }

    #[tokio::test(start_paused = true)]
    async fn disabled_flushes_every_event_on_its_own_one_at_a_time() {
        let config = DebounceConfig {
            enable: false,
            ..cfg(100, 10_000)
        };
        let h = start(config, Duration::from_millis(10));
        for v in 1..=3 {
            h.send(v).await;
        }
        h.at(5).await;
        assert_eq!(h.flushed(), vec![f(0, &[1])]);
        h.at(100).await;
        assert_eq!(h.flushed(), vec![f(0, &[1]), f(10, &[2]), f(20, &[3])]);
        assert_eq!(h.max_concurrent(), 1);
        h.finish().await;
    }

    #[tokio::test(start_paused = true)]
    async fn disabled_stays_bounded_behind_a_slow_flush_and_loses_nothing() {
        let config = DebounceConfig {
            enable: false,
            ..cfg(100, 10_000)
        };
        // The first flush takes 10 s; 1,000 events arrive meanwhile.
        let h = start(config, Duration::from_secs(10));
        for v in 1..=1000 {
            h.send(v).await;
        }
        h.at(5).await;
        let flushed = h.finish().await;
        assert_eq!(
            flushed.len(),
            1 + MAX_WAITING_UNMERGED,
            "{} flushes",
            flushed.len()
        );
        let mut values: Vec<u32> = flushed.iter().flat_map(|f| f.values.clone()).collect();
        values.sort_unstable();
        assert_eq!(values, (1..=1000).collect::<Vec<_>>(), "an event was lost");
        assert_eq!(
            flushed[1].values,
            vec![2],
            "events stay apart while there is room"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn closing_the_input_flushes_what_is_pending_at_once() {
        let h = start(cfg(100, 10_000), Duration::from_millis(300));
        h.send(1).await; // flush at 200 running until 500
        h.at(250).await;
        h.send(2).await;
        h.send(3).await;
        let flushed = h.finish().await;
        // The pending batch goes right after the running flush, without waiting for its timer.
        assert_eq!(flushed, vec![f(200, &[1]), f(500, &[2, 3])]);
    }

    #[tokio::test(start_paused = true)]
    async fn burst_of_a_thousand_events_is_one_flush() {
        let h = start(cfg(100, 10_000), Duration::ZERO);
        for v in 0..1_000 {
            h.send(v).await;
        }
        h.at(1_000).await;
        let flushed = h.finish().await;
        assert_eq!(flushed.len(), 1);
        assert_eq!(flushed[0].events, 1_000);
        assert_eq!(flushed[0].at_ms, 200);
    }
}
