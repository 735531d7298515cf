//! `leaseq hash-token`: the SHA-256 the `--auth-file` stores for a token.

use std::io::Read;

use clap::Args;

#[derive(Args, Debug)]
pub struct HashTokenArgs {
    /// Generate a new random token (256 bits) and print it and its hash,
    /// instead of reading a token from stdin.
    #[arg(long)]
    pub generate: bool,
}

/// Reads the token from stdin (not the command line, which other users can
/// see), trailing newline ignored, and prints its hash.
pub fn run(args: HashTokenArgs) -> anyhow::Result<()> {
    if args.generate {
        let token = leaseq_server::auth::generate_token();
        println!("token:  {token}");
        println!("sha256: {}", leaseq_server::auth::hash_token(&token));
        return Ok(());
    }
    let mut token = String::new();
    std::io::stdin().read_to_string(&mut token)?;
    let token = token.trim_end_matches(['\r', '\n']);
    anyhow::ensure!(!token.is_empty(), "no token on stdin");
    println!("{}", leaseq_server::auth::hash_token(token));
    Ok(())
}
