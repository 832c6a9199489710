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

/// torchft's lighthouse protocol (`torchft`), which `rdzv-server` serves
/// beside its own API so that torchft's managers can use it as their
/// lighthouse; see `proto/torchft/lighthouse.proto`.
pub mod torchft {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    tonic::include_proto!("torchft");
}

/// How `rdzv-server` keeps job state in a key-value store (not an API).
pub mod store {
    /// Version 1 of the stored records.
    pub mod v1 {
        #![allow(missing_docs, unreachable_pub, clippy::all)]
        tonic::include_proto!("accel.rendezvous.store.v1");
    }
}

/// Where a job's time went ([`v1::Goodput`]), in words, the same for
/// `rdzv-server status`, the status page's text and the agents' end line.
pub mod goodput {
    use super::v1::Goodput;

    /// A duration of `ms` milliseconds, short: `850ms`, `4.2s`, `3m07s`,
    /// `2h05m`.
    pub fn short(ms: u64) -> String {
        match ms {
            0..1_000 => format!("{ms}ms"),
            1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
            60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
            _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
        }
    }

    impl Goodput {
        /// The categories, named, in milliseconds.
        pub fn categories(&self) -> [(&'static str, u64); 5] {
            [
                ("productive", self.productive_ms),
                ("recomputation", self.recomputation_ms),
                ("recovery", self.recovery_ms),
                ("start-up", self.start_up_ms),
                ("waiting", self.waiting_ms),
            ]
        }

        /// All of them: the job's wall time.
        pub fn wall_ms(&self) -> u64 {
            self.categories()
                .iter()
                .fold(0u64, |a, (_, ms)| a.saturating_add(*ms))
        }

        /// Productive time over wall time, in percent (`None`: no time yet).
        pub fn percent(&self) -> Option<f64> {
            let wall = self.wall_ms();
            (wall > 0).then(|| self.productive_ms as f64 * 100.0 / wall as f64)
        }

        /// One line: `goodput 91.2 % of 1m54s: productive 1m44s,
        /// recomputation 4.0s (5 steps), recovery 4.1s (1 restart),
        /// start-up 3.0s, waiting 1.2s`; categories at 0 are left out.
        pub fn line(&self) -> String {
            let wall = self.wall_ms();
            let mut out = match self.percent() {
                Some(p) => format!("goodput {p:.1} % of {}:", short(wall)),
                None => return "goodput: no time yet".to_owned(),
            };
            let mut first = true;
            for (name, ms) in self.categories() {
                if ms == 0 {
                    continue;
                }
                out.push_str(if first { " " } else { ", " });
                first = false;
                out.push_str(&format!("{name} {}", short(ms)));
                if name == "recomputation" && self.lost_steps > 0 {
                    let s = if self.lost_steps == 1 { "" } else { "s" };
                    out.push_str(&format!(" ({} step{s})", self.lost_steps));
                }
                if name == "recovery" && self.restarts > 0 {
                    let s = if self.restarts == 1 { "" } else { "s" };
                    out.push_str(&format!(" ({} restart{s})", self.restarts));
                }
            }
            out
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_line_names_each_category_spent_and_the_share_that_was_productive() {
            let g = Goodput {
                productive_ms: 104_000,
                recomputation_ms: 4_000,
                recovery_ms: 4_100,
                start_up_ms: 3_000,
                waiting_ms: 0,
                restarts: 1,
                lost_steps: 5,
                ..Default::default()
            };
            assert_eq!(
                g.line(),
                "goodput 90.4 % of 1m55s: productive 1m44s, recomputation 4.0s (5 steps), \
                 recovery 4.1s (1 restart), start-up 3.0s"
            );
            assert_eq!(Goodput::default().line(), "goodput: no time yet");
            assert_eq!(short(7_500_000), "2h05m");
            assert_eq!(short(999), "999ms");
        }
    }
}
