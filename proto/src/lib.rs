//! The accel rendezvous API (`accel.rendezvous.v1`) and its generated code.
//!
//! The `.proto` file under `proto/` is the contract between `rdzv-server` and
//! `accel-agent`; see its comments for what each call and event means. The
//! Rust code is generated at build time by `protox` + `tonic-prost-build`, so
//! this crate needs no `protoc`. `tonic` and `prost` are re-exported so users of this
//! crate name one version of each.
#![forbid(unsafe_code)]

pub use prost;
pub use tonic;

/// The gRPC codec of the generated code: prost, with small buffers.
///
/// tonic's default codec gives every response stream an 8 KiB encode buffer
/// for the stream's whole life. The rendezvous holds one stream per agent and
/// its events are a few hundred bytes, so at 100,000 agents the default would
/// hold 800 MB of mostly empty buffers. Buffers still grow for a larger
/// message.
pub mod codec {
    use std::marker::PhantomData;

    use tonic::codec::{BufferSettings, Codec};
    use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

    /// Initial size of each encode and decode buffer.
    pub const BUFFER_BYTES: usize = 256;
    /// Bytes encoded before a stream yields to others (tonic's default).
    const YIELD_THRESHOLD: usize = 32 * 1024;

    /// prost encoding with [`BUFFER_BYTES`] buffers.
    #[derive(Debug, Clone, Copy)]
    pub struct CompactCodec<T, U>(PhantomData<(T, U)>);

    impl<T, U> Default for CompactCodec<T, U> {
        fn default() -> Self {
            Self(PhantomData)
        }
    }

    impl<T, U> Codec for CompactCodec<T, U>
    where
        T: prost::Message + Send + 'static,
        U: prost::Message + Default + Send + 'static,
    {
        type Encode = T;
        type Decode = U;
        type Encoder = ProstEncoder<T>;
        type Decoder = ProstDecoder<U>;

        fn encoder(&mut self) -> Self::Encoder {
            ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
        }

        fn decoder(&mut self) -> Self::Decoder {
            ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
        }
    }
}

/// Version 1 of the rendezvous API.
pub mod v1 {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    tonic::include_proto!("accel.rendezvous.v1");
}

/// How `rdzv-server` keeps job state in a key-value store (not an API).
pub mod store {
    /// Version 1 of the stored records.
    pub mod v1 {
        #![allow(missing_docs, unreachable_pub, clippy::all)]
        tonic::include_proto!("accel.rendezvous.store.v1");
    }
}
