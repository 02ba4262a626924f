//! The `shoal-bench` command line: parses the arguments, runs the mode, prints the summary and
//! writes the JSON report.

use std::path::Path;
use std::process::ExitCode;

use shoal_bench::cli::{self, Loopback, Parsed, Replay, Run};
use shoal_bench::replay::{SegmentLayout, measure};
use shoal_bench::run;

/// `shoal-bench loopback --size BYTES [--samples N] [--cpus SERVER,CLIENT]`: one JSON line.
fn loopback(Loopback { size, samples, cpus }: Loopback) -> ExitCode {
    let (server_cpu, client_cpu) = cpus.unzip();
    match shoal_bench::loopback::measure(size, samples, server_cpu, client_cpu) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("shoal-bench: loopback: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `shoal-bench replay --form FORM --dir DIR [--seconds S] [--wrap-bytes N] [--in-flight N]
/// [--segment-files N] [--checkpoint-rounds N]`: one JSON line.
fn replay(replay: &Replay) -> ExitCode {
    let layout =
        SegmentLayout { files: replay.segment_files, checkpoint_rounds: replay.checkpoint_rounds };
    let wrap_bytes = replay.wrap_bytes as u64;
    match measure(replay.form, &replay.dir, replay.seconds, wrap_bytes, replay.in_flight, layout) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("shoal-bench: replay: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `shoal-bench compare A.json B.json`.
fn compare(a: &Path, b: &Path) -> ExitCode {
    let read = |path: &Path| -> Result<serde_json::Value, String> {
        let path_text = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path_text}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("{path_text}: not a report: {e}"))
    };
    match (read(a), read(b)) {
        (Ok(a), Ok(b)) => {
            print!("{}", shoal_bench::compare::compare(&a, &b));
            ExitCode::SUCCESS
        }
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("shoal-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

/// A produce, consume, e2e or mixed run: the summary, then the report files asked for.
fn bench(command: &Run) -> ExitCode {
    let report = match run::run(&command.options) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("shoal-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", run::summary_text(&report));
    if let Some(path) = &command.html
        && let Err(error) = std::fs::write(path, shoal_bench::html::render(&report))
    {
        eprintln!("shoal-bench: writing {}: {error}", path.display());
        return ExitCode::FAILURE;
    }
    if let Some(path) = &command.json {
        let text = serde_json::to_string_pretty(&report).expect("a JSON value serializes");
        if let Err(error) = std::fs::write(path, text) {
            eprintln!("shoal-bench: writing {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    match cli::parse(std::env::args_os()) {
        Ok(Parsed::Run(command)) => bench(&command),
        Ok(Parsed::Compare(a, b)) => compare(&a, &b),
        Ok(Parsed::Loopback(options)) => loopback(options),
        Ok(Parsed::Replay(options)) => replay(&options),
        Err(error) => error.exit(),
    }
}
