//! Any bytes read as a stream of frames: the header checks, then every payload decoded as a
//! request and as a response. Nothing may panic or allocate beyond the frame limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oar::protocol::{read_frame_blocking, FrameBuf, Request, Response};

fuzz_target!(|data: &[u8]| {
    let mut stream = data;
    let mut buf = FrameBuf::default();
    // A small limit, so that lengths the input announces cannot ask for much memory.
    while let Ok(kind) = read_frame_blocking(&mut stream, &mut buf, 1 << 16) {
        let _ = Request::decode(kind, buf.payload());
        let _ = Response::decode(kind, buf.payload());
    }
});
