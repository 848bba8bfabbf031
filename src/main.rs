//! The `sqlfeed` binary; everything lives in [`sqlfeed::cli`].

fn main() -> std::process::ExitCode {
    sqlfeed::cli::main()
}
