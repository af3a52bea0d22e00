//! `vigil`: parse the command line, run the command, map failures to exit codes
//! (2 = bad configuration or command line, 3 = a drill that could not run, 1 = anything else,
//! including a drain that ran out of time).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

fn main() -> ExitCode {
    let cli = vigil::cli::Cli::parse();
    // NB: a fixed, small runtime whatever the node's CPU count: the agent is I/O-bound, and one
    // thread per CPU on a 208-vCPU GPU node only costs memory and wake-ups. Two threads in all:
    // this one runs `vigil run`'s own loop (the cycle), one worker runs the spawned tasks (the
    // servers, the watchers, the Node controller), so a slow call in one never stalls the other.
    // Blocking calls (a log file's tail on CRI, the TPU's sysfs reads, a DNS lookup) borrow a
    // short-lived thread that goes after 2 s idle. NVML has its own thread, on GPU nodes only.
    let built = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(4)
        .thread_keep_alive(Duration::from_secs(2))
        .thread_name("vigil")
        .enable_all()
        .build()
        .inspect_err(|e| eprintln!("vigil: cannot start the async runtime: {e}"));
    let Ok(runtime) = built else { return ExitCode::from(1) };
    let result = runtime.block_on(vigil::cli::dispatch(cli));
    // Tasks still running (a call stuck on a dead dependency) are dropped, not waited for: the
    // drain already had its deadline.
    runtime.shutdown_timeout(Duration::from_millis(500));
    let Err(e) = result else { return ExitCode::SUCCESS };
    eprintln!("vigil: {e}");
    ExitCode::from(e.exit_code())
}
