//! A program with a layer of its own: oar's whole command line (`launch`, `train`, `pserver`,
//! `eval`, the cluster engines) with one more layer type, `glu_gate`, that a job file can name.
//!
//! `glu_gate` is a learned feature gate (as in GLU or FiBiNET's SENet): `y = x * sigmoid(x Wg + bg)`,
//! each input value scaled by a gate computed from the whole input. It is not in oar's
//! catalogue; this file is everything it takes to add it.
//!
//! ```sh
//! cargo build --release --example custom_layer
//! target/release/examples/custom_layer launch --servers 2 --workers 2 \
//!     --config examples/custom_layer.toml --train data/synth/train --test data/synth/test
//! ```
//! `launch` starts its servers and trainers from this same binary, so every process knows
//! `glu_gate`.

mod gate;

fn main() {
    let registry = oar::model::Registry::with_builtin().register("glu_gate", gate::gate);
    oar::cli::main_with(registry)
}
