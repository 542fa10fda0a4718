//! Any bytes read as a stream of frames: the header checks, then every payload decoded as a
//! request and as a response. Every other frame is read as a pull's reply whose arrays are read
//! into place (`read_reply_blocking`), each of them taken when it is of at most 64 floats.
//! Nothing may panic or allocate beyond the frame limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oar::protocol::{read_frame_blocking, read_reply_blocking, FrameBuf, ProtocolError, Request, Response, ValuesArray};

fuzz_target!(|data: &[u8]| {
    let mut stream = data;
    let mut buf = FrameBuf::default();
    let mut placed = [0u8; 64 * 4];
    let mut place = |r: &mut dyn std::io::Read, _: ValuesArray, floats: usize| -> Result<bool, ProtocolError> {
        if floats > 64 {
            return Ok(false);
        }
        std::io::Read::read_exact(r, &mut placed[..floats * 4])?;
        Ok(true)
    };
    // A small limit, so that lengths the input announces cannot ask for much memory.
    for k in 0.. {
        let read = if k % 2 == 0 {
            read_frame_blocking(&mut stream, &mut buf, 1 << 16)
        } else {
            read_reply_blocking(&mut stream, &mut buf, 1 << 16, &mut place)
        };
        let Ok(kind) = read else { break };
        let _ = Request::decode(kind, buf.payload());
        let _ = Response::decode(kind, buf.payload());
    }
});
