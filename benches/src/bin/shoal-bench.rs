//! The `shoal-bench` command line: parses the arguments, runs the mode, prints the summary and
//! writes the JSON report.

use std::process::ExitCode;

use shoal_bench::{cli, run};

/// `shoal-bench loopback --size BYTES [--samples N] [--cpus SERVER,CLIENT]`: one JSON line.
fn loopback(words: &[String]) -> ExitCode {
    let (mut size, mut samples, mut cpus) = (1usize << 20, 2000usize, (None, None));
    let mut words = words.iter();
    while let Some(flag) = words.next() {
        let value = words.next().map(String::as_str).unwrap_or_default();
        let parsed = match flag.as_str() {
            "--size" => value.parse().map(|v| size = v).is_ok(),
            "--samples" => value.parse().map(|v| samples = v).is_ok(),
            "--cpus" => match value.split_once(',').map(|(a, b)| (a.parse(), b.parse())) {
                Some((Ok(a), Ok(b))) => {
                    cpus = (Some(a), Some(b));
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if !parsed || size == 0 || samples == 0 {
            eprintln!("shoal-bench: loopback {flag} {value}: bad argument\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    }
    match shoal_bench::loopback::measure(size, samples, cpus.0, cpus.1) {
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

/// `shoal-bench compare A.json B.json`.
fn compare(paths: &[String]) -> ExitCode {
    let [a, b] = paths else {
        eprintln!("shoal-bench: compare takes two report files\n\n{}", cli::USAGE);
        return ExitCode::from(2);
    };
    let read = |path: &String| -> Result<serde_json::Value, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("{path}: not a report: {e}"))
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

fn main() -> ExitCode {
    let words: Vec<String> = std::env::args().skip(1).collect();
    if words.first().map(String::as_str) == Some("compare") {
        return compare(&words[1..]);
    }
    if words.first().map(String::as_str) == Some("loopback") {
        return loopback(&words[1..]);
    }
    let command = match cli::parse(&words) {
        Ok(Some(command)) => command,
        Ok(None) => {
            print!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("shoal-bench: {error}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
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
