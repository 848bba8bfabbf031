//! The `sqlfeed` binary; everything lives in the library's `cli` module.

/// mimalloc, like datafusion-cli: see the workspace manifest for why.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sqlfeed::cli::main()
}
