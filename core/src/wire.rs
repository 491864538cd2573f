//! Messages encoded as the pieces the transport sends one after another, so bulk data
//! (a read's bytes, a pushed piece) is not copied into the envelope around it. The
//! envelope is encoded around the data by hand, the fields on either side by prost, so
//! the pieces joined are exactly the bytes prost encodes for the whole message (the
//! tests hold them to it).

use bytes::Bytes;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use crate::pb;
use crate::runtime::Parts;

/// The largest message either way, on every transport (real and simulated alike, so a
/// message the simulator lets through is one a real cluster carries). Pieces of data are
/// at most a few MiB; a master group's snapshot goes in parts well below it.
pub const MAX_MESSAGE: usize = 64 << 20;

/// Data smaller than this is encoded with its message; larger keeps a piece of its own.
pub const SPLIT_AT: usize = 64 << 10;

/// A chunkserver's reply. A read's data is a piece of its own.
pub fn reply_parts(resp: pb::ChunkResponse) -> Parts {
    match resp {
        pb::ChunkResponse {
            error: None,
            resp: Some(pb::chunk_response::Resp::Read(r)),
            report_seq,
        } if r.data.len() >= SPLIT_AT => {
            // ChunkResponse { read = 3 { data = 1, chunk_length = 2 }, report_seq = 5 }.
            let after = pb::ReadChunkResponse {
                data: Bytes::new(),
                ..r
            };
            let mut parts = around(3, Vec::new(), 1, r.data, after.encode_to_vec());
            let tail = pb::ChunkResponse {
                report_seq,
                ..Default::default()
            };
            parts.0.push(tail.encode_to_vec().into());
            parts
        }
        other => other.encode_to_vec().into(),
    }
}

/// A request to a chunkserver. A pushed piece is a piece of its own.
pub fn request_parts(req: pb::ChunkRequest) -> Parts {
    match req {
        pb::ChunkRequest {
            req: Some(pb::chunk_request::Req::Push(p)),
        } if p.piece.len() >= SPLIT_AT => {
            // ChunkRequest.push = 8 { data_id = 1, offset = 2, total = 3, piece = 4,
            // chain = 5 }.
            let before = pb::PushDataRequest {
                piece: Bytes::new(),
                chain: Vec::new(),
                ..p
            };
            let after = pb::PushDataRequest {
                chain: p.chain,
                ..Default::default()
            };
            around(8, before.encode_to_vec(), 4, p.piece, after.encode_to_vec())
        }
        other => other.encode_to_vec().into(),
    }
}

/// Field `outer` (a message) holding, in order: `before` (its fields numbered below
/// `tag`, encoded), field `tag` = `data`, then `after` (its fields numbered above).
fn around(outer: u32, before: Vec<u8>, tag: u32, data: Bytes, after: Vec<u8>) -> Parts {
    let n = data.len();
    let inner = before.len() + key_len(tag) + encoded_len_varint(n as u64) + n + after.len();
    let mut head = Vec::with_capacity(before.len() + 24);
    encode_key(outer, WireType::LengthDelimited, &mut head);
    encode_varint(inner as u64, &mut head);
    head.extend_from_slice(&before);
    encode_key(tag, WireType::LengthDelimited, &mut head);
    encode_varint(n as u64, &mut head);
    Parts(vec![head.into(), data, after.into()])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::runtime::PartsReader;

    const SIZES: [usize; 7] = [0, 1, 100, SPLIT_AT - 1, SPLIT_AT, 200_000, 4 << 20];

    #[test]
    fn a_read_reply_in_pieces_is_the_message_prost_encodes() {
        for n in SIZES {
            for (chunk_length, report_seq) in [
                (0, 0),
                (1, 1),
                (300, 77),
                (64 << 20, 0),
                (u64::MAX, u64::MAX),
            ] {
                let resp = pb::ChunkResponse {
                    error: None,
                    resp: Some(pb::chunk_response::Resp::Read(pb::ReadChunkResponse {
                        data: Bytes::from(vec![7u8; n]),
                        chunk_length,
                    })),
                    report_seq,
                };
                let parts = reply_parts(resp.clone());
                assert_eq!(parts.0.len(), if n >= SPLIT_AT { 4 } else { 1 });
                assert_eq!(
                    parts.concat(),
                    resp.encode_to_vec(),
                    "{n} bytes, length {chunk_length}"
                );
            }
        }
        let other = pb::ChunkResponse::default();
        assert_eq!(reply_parts(other.clone()).concat(), other.encode_to_vec());
    }

    proptest! {
        #[test]
        fn a_push_in_pieces_is_the_message_prost_encodes(
            n in prop::sample::select(SIZES.to_vec()),
            data_id in any::<u64>(),
            offset in prop_oneof![Just(0u64), any::<u64>()],
            total in prop_oneof![Just(0u64), any::<u64>()],
            chain in proptest::collection::vec("[a-z0-9.:]{0,20}", 0..4),
        ) {
            let req = pb::ChunkRequest {
                req: Some(pb::chunk_request::Req::Push(pb::PushDataRequest { capabilities: vec![], handle: 0,
                    data_id,
                    offset,
                    total,
                    piece: Bytes::from(vec![3u8; n]),
                    chain,
                })),
            };
            let parts = request_parts(req.clone());
            prop_assert_eq!(parts.0.len(), if n >= SPLIT_AT { 3 } else { 1 });
            prop_assert_eq!(parts.concat(), req.encode_to_vec());
        }
    }

    #[test]
    fn other_requests_are_encoded_whole() {
        let req = pb::ChunkRequest {
            req: Some(pb::chunk_request::Req::Write(pb::WriteChunkRequest {
                data: Bytes::from(vec![1u8; 1 << 20]),
                ..Default::default()
            })),
        };
        let parts = request_parts(req.clone());
        assert_eq!(parts.0.len(), 1);
        assert_eq!(parts.concat(), req.encode_to_vec());
    }

    #[test]
    fn data_received_in_its_pieces_decodes_uncopied() {
        let data = Bytes::from(vec![9u8; 1 << 20]);
        let resp = pb::ChunkResponse {
            error: None,
            resp: Some(pb::chunk_response::Resp::Read(pb::ReadChunkResponse {
                data: data.clone(),
                chunk_length: 64 << 20,
            })),
            ..Default::default()
        };
        let got = pb::ChunkResponse::decode(PartsReader::from(reply_parts(resp.clone())))
            .expect("decodes");
        assert_eq!(got, resp);
        let Some(pb::chunk_response::Resp::Read(r)) = got.resp else {
            unreachable!()
        };
        assert_eq!(r.data.as_ptr(), data.as_ptr(), "the data was copied");
        let req = pb::ChunkRequest {
            req: Some(pb::chunk_request::Req::Push(pb::PushDataRequest {
                piece: data.clone(),
                chain: vec!["a:1".into()],
                ..Default::default()
            })),
        };
        let got = pb::ChunkRequest::decode(PartsReader::from(request_parts(req.clone())))
            .expect("decodes");
        assert_eq!(got, req);
        let Some(pb::chunk_request::Req::Push(p)) = got.req else {
            unreachable!()
        };
        assert_eq!(p.piece.as_ptr(), data.as_ptr(), "the piece was copied");
    }
}
