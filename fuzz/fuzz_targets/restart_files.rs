//! Any bytes as each file a restarted process reads (a server's `fence.json`, `trainers.json`,
//! a checkpoint's `entry.json` and shard file, a trainer's position record, a saved model's
//! manifest): the readers must refuse or accept, never panic, hang or allocate beyond what the
//! bytes hold. The first byte picks the file.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("oar-fuzz-restart-{}", std::process::id()));
        std::fs::create_dir_all(d.join("server-0/ckpt-000001")).unwrap();
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else { return };
    let d = dir();
    let server = d.join("server-0");
    let ckpt = server.join("ckpt-000001");
    match which % 6 {
        0 => {
            std::fs::write(server.join("fence.json"), bytes).unwrap();
            let _ = oar::server::shard_checkpoints::Fence::read(&server);
            let _ = oar::server::shard_checkpoints::earlier_life(d, 0, "j");
        }
        1 => {
            std::fs::write(server.join("trainers.json"), bytes).unwrap();
            let _ = oar::server::shard_checkpoints::Trainers::read(d, 0, "j", 4);
        }
        2 => {
            std::fs::write(ckpt.join("entry.json"), bytes).unwrap();
            let _ = oar::server::shard_checkpoints::load_latest(d, 0, "j");
        }
        3 => {
            std::fs::write(ckpt.join("server-0.shard"), bytes).unwrap();
            let _ = oar::persist::checkpoint::read_shard(&ckpt.join("server-0.shard"));
        }
        4 => {
            std::fs::write(d.join("trainer-0.position"), bytes).unwrap();
            if let Ok(Some(p)) = oar::train::position::Position::read(d, 0) {
                let _ = p.check_passes(d, 3);
            }
        }
        _ => {
            std::fs::write(ckpt.join("manifest.json"), bytes).unwrap();
            if let Ok((m, pass_dir)) = oar::persist::checkpoint::Manifest::find(&ckpt) {
                if m.num_servers > 0 {
                    let _ = m.load_shard(&pass_dir, 0);
                }
            }
        }
    }
});
