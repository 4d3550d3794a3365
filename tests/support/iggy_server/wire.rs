//! Framing: decoding request headers, telling the login shapes apart, and
//! assembling reply and eviction frames.
//!
//! Every frame is a 256-byte consensus header followed by a body. Replies are
//! built in one contiguous buffer whose first 256 bytes are reserved for the
//! header, so a reply is written to the socket with a single `write_all`.

use bytes::{BufMut, Bytes, BytesMut};
use iggy_binary_protocol::codec::{WireDecode, WireEncode};
use iggy_binary_protocol::codes::{
    LOGIN_REGISTER_CODE, LOGIN_REGISTER_WITH_PAT_CODE, LOGOUT_USER_CODE,
};
use iggy_binary_protocol::consensus::{
    Command, EvictionHeader, EvictionReason, HEADER_SIZE, Operation, ReplyHeader, RequestHeader,
};
use iggy_binary_protocol::requests::users::{LoginRegisterRequest, LoginRegisterWithPatRequest};
use iggy_binary_protocol::version::ClientVersionInfo;

/// Largest request frame accepted. The background producer coalesces sends
/// into requests of a few MiB; anything far above that is a broken peer.
pub(crate) const MAX_FRAME_SIZE: usize = 256 * 1024 * 1024;

/// Cosmetic cluster id stamped on replicated replies (the client ignores it).
const CLUSTER_ID: u128 = 0x1667_7e57;

/// Decodes a request header; `None` means the peer is not speaking the
/// protocol (unknown operation or command byte, or an impossible size), and
/// the connection should be closed.
pub(crate) fn decode_request_header(bytes: &[u8; HEADER_SIZE]) -> Option<RequestHeader> {
    let header = bytemuck::checked::try_pod_read_unaligned::<RequestHeader>(bytes).ok()?;
    let size = header.size as usize;
    (header.command == Command::Request && (HEADER_SIZE..=MAX_FRAME_SIZE).contains(&size))
        .then_some(header)
}

/// The two bodies a `Register` operation can carry. Both ride the same
/// operation, so only the body shape says which login the client meant.
pub(crate) enum LoginBody {
    Password(LoginRegisterRequest),
    Token(LoginRegisterWithPatRequest),
    Malformed,
}

impl LoginBody {
    pub(crate) fn parse(body: &[u8]) -> Self {
        let Ok((version, prefix_len)) = ClientVersionInfo::decode(body) else {
            return Self::Malformed;
        };
        let tail = &body[prefix_len..];
        if let Ok((login, used)) = LoginRegisterRequest::decode_after_prefix(version.clone(), tail)
            && used == tail.len()
        {
            return Self::Password(login);
        }
        if let Ok((login, used)) = LoginRegisterWithPatRequest::decode_after_prefix(version, tail)
            && used == tail.len()
        {
            return Self::Token(login);
        }
        Self::Malformed
    }

    pub(crate) fn command_code(&self) -> u32 {
        match self {
            Self::Token(_) => LOGIN_REGISTER_WITH_PAT_CODE,
            Self::Password(_) | Self::Malformed => LOGIN_REGISTER_CODE,
        }
    }

    pub(crate) fn protocol_version(&self) -> Option<u32> {
        match self {
            Self::Password(login) => Some(login.version_info.protocol_version),
            Self::Token(login) => Some(login.version_info.protocol_version),
            Self::Malformed => None,
        }
    }
}

/// The command code a request stands for. Replicated operations imply their
/// code; non-replicated requests carry it in the first four reserved bytes.
/// `Register` is resolved by the caller from the body shape.
pub(crate) fn command_code(header: &RequestHeader) -> u32 {
    match header.operation {
        Operation::NonReplicated => u32::from_le_bytes(
            header.reserved[..4]
                .try_into()
                .expect("the reserved area is longer than four bytes"),
        ),
        Operation::Logout => LOGOUT_USER_CODE,
        Operation::Register => LOGIN_REGISTER_CODE,
        operation => operation.to_command_code().unwrap_or(0),
    }
}

/// Decodes a typed request body, mapping a decode failure to `None`.
pub(crate) fn decode<T: WireDecode>(body: &[u8]) -> Option<T> {
    T::decode_from(body).ok()
}

/// A reply under construction: status, body and the header fields the
/// handlers decide. The first `HEADER_SIZE` bytes of `buf` are a placeholder
/// for the header written by [`Reply::into_frame`].
pub(crate) struct Reply {
    buf: BytesMut,
    pub(crate) status: u32,
    pub(crate) op: u64,
    pub(crate) commit: u64,
    /// Replaces the echoed request operation (create topic is answered as
    /// `CreateTopicWithAssignments`).
    pub(crate) operation: Option<Operation>,
    /// Replicated replies carry a cluster id and a server timestamp.
    pub(crate) replicated: bool,
}

impl Reply {
    /// A status-0 reply with an empty body, i.e. a read that found nothing.
    pub(crate) fn empty() -> Self {
        Self::with_capacity(0)
    }

    pub(crate) fn with_capacity(body_capacity: usize) -> Self {
        let mut buf = BytesMut::with_capacity(HEADER_SIZE + body_capacity);
        buf.put_bytes(0, HEADER_SIZE);
        Self {
            buf,
            status: 0,
            op: 0,
            commit: 0,
            operation: None,
            replicated: false,
        }
    }

    /// A read reply whose body is one encoded value.
    pub(crate) fn read<T: WireEncode>(value: &T) -> Self {
        let mut reply = Self::with_capacity(value.encoded_size());
        value.encode(&mut reply.buf);
        reply
    }

    /// A pre-commit denial: non-zero status, empty body.
    pub(crate) fn denied(status: u32) -> Self {
        let mut reply = Self::empty();
        reply.status = status;
        reply
    }

    /// A result-framed success (`count = 0`) followed by `payload`.
    pub(crate) fn committed<T: WireEncode>(payload: &T) -> Self {
        let mut reply = Self::with_capacity(4 + payload.encoded_size());
        reply.buf.put_u32_le(0);
        payload.encode(&mut reply.buf);
        reply
    }

    /// A result-framed success with no payload.
    pub(crate) fn committed_empty() -> Self {
        let mut reply = Self::with_capacity(4);
        reply.buf.put_u32_le(0);
        reply
    }

    /// A result-framed business rejection carrying `code`.
    pub(crate) fn rejected(code: u32) -> Self {
        let mut reply = Self::with_capacity(12);
        reply.buf.put_u32_le(1);
        reply.buf.put_u32_le(0);
        reply.buf.put_u32_le(code);
        reply
    }

    /// Stamps the op/commit pair of a replicated operation.
    pub(crate) fn at_op(mut self, op: u64) -> Self {
        self.op = op;
        self.commit = op;
        self.replicated = true;
        self
    }

    pub(crate) fn body_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Writes the header in front of the body and returns the whole frame.
    pub(crate) fn into_frame(mut self, request: &RequestHeader, now_micros: u64) -> Bytes {
        let size = u32::try_from(self.buf.len()).expect("reply frames stay below 4 GiB");
        let header = ReplyHeader {
            cluster: if self.replicated { CLUSTER_ID } else { 0 },
            size,
            command: Command::Reply,
            request_checksum: request.request_checksum,
            client: request.client,
            op: self.op,
            commit: self.commit,
            timestamp: if self.replicated { now_micros } else { 0 },
            request: request.request,
            operation: self.operation.unwrap_or(request.operation),
            status: self.status,
            ..ReplyHeader::default()
        };
        self.buf[..HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&header));
        self.buf.freeze()
    }
}

/// A header-only eviction frame.
pub(crate) fn eviction_frame(client: u128, reason: EvictionReason) -> Bytes {
    let header = EvictionHeader::new(0, 0, 0, client, reason);
    Bytes::copy_from_slice(bytemuck::bytes_of(&header))
}

/// The eviction frame for a client outside the accepted protocol window.
pub(crate) fn incompatible_protocol_frame(client: u128) -> Bytes {
    use iggy_binary_protocol::version::{IGGY_PROTOCOL_VERSION, IGGY_PROTOCOL_VERSION_MIN};
    let header = EvictionHeader::incompatible_protocol(
        0,
        0,
        0,
        client,
        IGGY_PROTOCOL_VERSION,
        IGGY_PROTOCOL_VERSION_MIN,
    );
    Bytes::copy_from_slice(bytemuck::bytes_of(&header))
}
