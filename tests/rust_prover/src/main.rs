//! A stand-in prover with SP1 v6's span shape, logged the way SP1's default logger does
//! (`crates/core/machine/src/utils/logger.rs`, RUST_LOGGER unset): tracing-subscriber's
//! `fmt` layer, compact, with `FmtSpan::CLOSE`, target/file/thread names off, ANSI on
//! even into a pipe. Each span's close line carries `time.busy` and `time.idle`.
//!
//! Usage: rust_prover [compact|full] [ansi|plain] [time|no-time] [shards N]
//!
//! The sleeps are the "work": tests check the rebuilt durations against them.
//! Two shards are proved on two threads at once, so their close lines interleave.

use std::thread;
use std::time::Duration;

use tracing::{info, info_span};
use tracing_subscriber::fmt::format::FmtSpan;

fn work(ms: u64) {
    thread::sleep(Duration::from_millis(ms));
}

fn prove_shard(parent: &tracing::Span, shard: u32) {
    let span = info_span!(parent: parent, "prove shard with data", shard = shard);
    let _g = span.enter();
    info_span!("commit traces").in_scope(|| work(15));
    info_span!("logup gkr proof").in_scope(|| work(10));
    info_span!("zerocheck").in_scope(|| {
        // Rounds as nested spans: several siblings with one name.
        for round in 0..3u32 {
            info_span!("zerocheck round", round = round).in_scope(|| work(3));
        }
    });
    // Created now, entered 20 ms later: 20 ms of time.idle before its time.busy.
    let claims = info_span!("prove evaluation claims");
    work(20);
    claims.in_scope(|| work(12));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |s: &str| args.iter().any(|a| a == s);
    let shards: u32 = args
        .iter()
        .position(|a| a == "shards")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);

    // SP1's logger: fmt, compact, FmtSpan::CLOSE, no target/file/line/thread names.
    // `without_time` on the builder would also drop time.busy/time.idle from the close
    // lines, so "no-time" leaves the timestamp out of the event format only.
    let format = tracing_subscriber::fmt::format()
        .with_target(false)
        .with_file(false)
        .with_line_number(false)
        .with_thread_names(false)
        .with_ansi(!has("plain"));
    let builder = tracing_subscriber::fmt()
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(!has("plain"));
    match (has("full"), has("no-time")) {
        (false, false) => builder.event_format(format.compact()).init(),
        (false, true) => builder.event_format(format.compact().without_time()).init(),
        (true, false) => builder.event_format(format).init(),
        (true, true) => builder.event_format(format.without_time()).init(),
    }

    let prove = info_span!("prove", mode = "Compressed");
    let _p = prove.enter();
    info_span!("execute_program", cycles = 1_048_576u64).in_scope(|| work(25));
    let core = info_span!("core prove with pk");
    core.in_scope(|| {
        let handles: Vec<_> = (0..shards)
            .map(|shard| {
                let parent = core.clone();
                thread::Builder::new()
                    .name(format!("shard-{shard}"))
                    .spawn(move || prove_shard(&parent, shard))
                    .expect("spawn a shard thread")
            })
            .collect();
        for h in handles {
            h.join().expect("a shard thread panicked");
        }
    });
    drop(core);
    info_span!("prove shrink").in_scope(|| work(8));
    info!(proof_size = 1234u64, "proof done");
}
