//! `shoalctl`: administers a Shoal server (streams, topics, status) and produces or consumes
//! messages from the command line. The work is in `shoal_tools::ctl`; see `docs/client.md`.

use std::process::ExitCode;

fn main() -> ExitCode {
    shoal_tools::ctl::main(std::env::args_os())
}
