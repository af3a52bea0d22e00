//! `vigil`: parse the command line, run the command, map failures to exit codes
//! (2 = bad configuration, 1 = anything else).

use clap::Parser;

#[tokio::main]
async fn main() {
    let cli = vigil::cli::Cli::parse();
    if let Err(e) = vigil::cli::dispatch(cli).await {
        eprintln!("vigil: {e}");
        std::process::exit(e.exit_code());
    }
}
