//! The `oar` binary: the command line of [`oar::cli`] with the built-in layer types.

fn main() {
    oar::cli::main_with(oar::model::Registry::with_builtin())
}
