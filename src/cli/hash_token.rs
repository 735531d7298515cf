//! `leaseq hash-token`: the SHA-256 the `--auth-file` stores for a token.

use std::io::Read;

use clap::Args;
use serde_json::json;

use super::output::print_json;
use super::{CliError, Output};

#[derive(Args, Debug)]
pub struct HashTokenArgs {
    /// Generate a new random token (256 bits) and print it and its hash,
    /// instead of reading a token from stdin.
    #[arg(long)]
    pub generate: bool,
    /// Output: the hash (and the token, with --generate) as text, or
    /// {"sha256"} ({"token", "sha256"} with --generate).
    #[arg(long, short = 'o', value_enum, default_value_t)]
    pub output: Output,
}

/// Reads the token from stdin (not the command line, which other users can
/// see), trailing newline ignored, and prints its hash.
pub fn run(args: HashTokenArgs) -> Result<(), CliError> {
    if args.generate {
        let token = leaseq_server::generate_token();
        let sha256 = leaseq_server::hash_token(&token);
        match args.output {
            Output::Json => print_json(&json!({"token": token, "sha256": sha256})),
            Output::Table => {
                println!("token:  {token}");
                println!("sha256: {sha256}");
            }
        }
        return Ok(());
    }
    let mut token = String::new();
    std::io::stdin()
        .read_to_string(&mut token)
        .map_err(|e| CliError::error(format!("reading the token from stdin: {e}")))?;
    let token = token.trim_end_matches(['\r', '\n']);
    if token.is_empty() {
        return Err(CliError::usage("no token on stdin"));
    }
    let sha256 = leaseq_server::hash_token(token);
    match args.output {
        Output::Json => print_json(&json!({ "sha256": sha256 })),
        Output::Table => println!("{sha256}"),
    }
    Ok(())
}
