//! A gRPC codec that passes message bodies through untouched: Tessera's envelopes are
//! already prost-encoded by the drivers and the client. A message to send may come in
//! pieces (a read's data apart from its envelope); each is copied into the frame buffer
//! once. A message received is one piece, uncopied.

use bytes::{Buf, BufMut};
use tessera_core::runtime::Parts;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Parts;
    type Decode = Parts;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Parts;
    type Error = Status;

    fn encode(&mut self, item: Parts, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.len());
        for piece in item.0 {
            dst.put(piece);
        }
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Parts;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Parts>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n).into()))
    }
}
