//! The `shoal-bench` command line: parses the arguments, runs the mode, prints the summary and
//! writes the JSON report.

use std::process::ExitCode;

use shoal_bench::{cli, run};

fn main() -> ExitCode {
    let words: Vec<String> = std::env::args().skip(1).collect();
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
    if let Some(path) = &command.json {
        let text = serde_json::to_string_pretty(&report).expect("a JSON value serializes");
        if let Err(error) = std::fs::write(path, text) {
            eprintln!("shoal-bench: writing {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
