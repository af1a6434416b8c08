//! The forge and call paths of a compose tool with no wasm and no JS boundary: the registry
//! natively, host tools as Rust closures, the test-double judge (a scripted model that
//! approves). It measures the floor the work itself sets — normalize, shape check, build, two
//! tests with schema and expected-output checks, the judge's prompt and verdict, content hash,
//! audit entries, stats, persistence — to compare with `npm run bench:forge`, where the same
//! work runs in wasm behind the JS boundary.
//!
//! Run: cargo bench --bench native_forge

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Instant;

use futures::executor::block_on;
use serde_json::{json, Value};
use support::emergent::rig;

fn compose_request(name: &str) -> Value {
    let text = json!({ "type": "object", "properties": { "text": { "type": "string" } }, "required": ["text"] });
    json!({
        "name": name,
        "description": "Upper-case the text twice",
        "inputSchema": text,
        "outputSchema": text,
        "implementation": { "mode": "compose", "steps": [
            { "name": "up", "tool": "upper_case", "inputMapping": { "text": "$input.text" } },
            { "name": "again", "tool": "upper_case", "inputMapping": { "text": "$prev.text" } }
        ] },
        "testCases": [
            { "input": { "text": "hello" }, "expectedOutput": { "text": "HELLO" } },
            { "input": { "text": "forge it" }, "expectedOutput": { "text": "FORGE IT" } }
        ]
    })
}

/// Median of `rounds` round medians of `per_round` timed runs of `f`, in µs.
fn median_us(rounds: usize, per_round: usize, mut f: impl FnMut(usize)) -> f64 {
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    let mut n = 0;
    let round_medians = (0..rounds)
        .map(|_| {
            median(
                (0..per_round)
                    .map(|_| {
                        let start = Instant::now();
                        f(n);
                        n += 1;
                        start.elapsed().as_secs_f64() * 1e6
                    })
                    .collect(),
            )
        })
        .collect();
    median(round_medians)
}

fn main() {
    let r = rig();
    // Sessions of 8 tools, as the forge bench's registry stays small.
    let forge = median_us(5, 400, |i| {
        let result = block_on(r.registry.forge(&compose_request(&format!("shout_{i}")), &format!("s{}", i / 8)));
        assert!(result.success, "{result:?}");
    });
    assert!(block_on(r.registry.forge(&compose_request("shout"), "calls")).success);
    let args = json!({ "text": "crucible forges tools" });
    let call = median_us(5, 20_000, |_| {
        block_on(r.registry.call("shout", args.clone(), "calls")).unwrap();
    });
    let host = median_us(5, 20_000, |_| {
        block_on(r.registry.call("upper_case", args.clone(), "calls")).unwrap();
    });
    println!("native (no wasm, no JS boundary), medians:");
    println!("  compose forge (2 steps, 2 tests, judged, registered): {forge:.1} µs");
    println!("  compose call  (2 host steps):                         {call:.2} µs");
    println!("  host tool call through the registry:                  {host:.2} µs");
}
