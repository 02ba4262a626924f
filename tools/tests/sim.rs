//! `shoal-sim` as a user runs it: one seed reproduces bit for bit across separate processes
//! (same trace hash), a swarm exits 0 when every seed passes, and bad flags get a clear error.

use std::process::Command;

fn shoal_sim(args: &[&str]) -> (bool, String) {
    let output =
        Command::new(env!("CARGO_BIN_EXE_shoal-sim")).args(args).output().expect("shoal-sim runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

fn trace_hash(text: &str) -> String {
    text.lines().find(|l| l.starts_with("trace_hash=")).expect("a trace hash line").to_string()
}

#[test]
fn one_seed_reproduces_across_processes() {
    let args = ["--seed", "17", "--ticks", "3000"];
    let (first_ok, first) = shoal_sim(&args);
    let (second_ok, second) = shoal_sim(&args);
    assert!(first_ok && second_ok, "{first}\n{second}");
    assert!(first.contains("result=pass"), "{first}");
    assert_eq!(trace_hash(&first), trace_hash(&second));
    let (_, other) = shoal_sim(&["--seed", "18", "--ticks", "3000"]);
    assert_ne!(trace_hash(&first), trace_hash(&other));
}

#[test]
fn a_small_swarm_passes_and_reports_its_seeds() {
    let (ok, text) =
        shoal_sim(&["--seeds", "4", "--from", "100", "--ticks", "2000", "--replicas", "5"]);
    assert!(ok, "{text}");
    assert!(text.contains("seeds 100..104: 4 passed, 0 failed"), "{text}");
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    let (ok, text) = shoal_sim(&["--seed", "1", "--replicas", "9"]);
    assert!(!ok);
    assert!(text.contains("--replicas 9"), "{text}");
    let (ok, text) = shoal_sim(&["--seed", "1", "--seeds", "2"]);
    assert!(!ok);
    assert!(text.contains("exactly one of --seed and --seeds"), "{text}");
}
