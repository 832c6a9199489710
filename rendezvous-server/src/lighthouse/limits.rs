//! Bounds on what a replica group may send the lighthouse. A quorum carries
//! every member's fields to every member, so each is bounded: a quorum of
//! [`super::MAX_GROUPS`] groups stays a few megabytes.

use accel_proto::torchft as pb;
use tonic::Status;

/// The longest replica id (torchft's are `{group}:{uuid}`).
pub const MAX_ID_BYTES: usize = 256;
/// The longest address or store address.
pub const MAX_ADDRESS_BYTES: usize = 512;
/// The most bytes of a member's opaque `data`.
pub const MAX_DATA_BYTES: usize = 4096;
/// The most reconfigure handles, and the longest one.
pub const MAX_HANDLES: usize = 64;
/// The longest reconfigure handle.
pub const MAX_HANDLE_BYTES: usize = 512;
/// The largest request the lighthouse decodes.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// The largest quorum (its members, encoded): under the 4 MiB a torchft
/// client decodes. A group whose joining would make the next quorum larger
/// is refused.
pub const MAX_QUORUM_BYTES: usize = 3 * 1024 * 1024;

/// Checks a quorum request's member.
pub fn check_member(m: &pb::QuorumMember) -> Result<(), Status> {
    check_id(&m.replica_id)?;
    for (what, v) in [("address", &m.address), ("store_address", &m.store_address)] {
        if v.len() > MAX_ADDRESS_BYTES {
            return Err(Status::invalid_argument(format!(
                "the quorum request's {what} has {} bytes; at most {MAX_ADDRESS_BYTES}",
                v.len()
            )));
        }
    }
    if m.data.len() > MAX_DATA_BYTES {
        return Err(Status::invalid_argument(format!(
            "the quorum request's data has {} bytes; at most {MAX_DATA_BYTES}",
            m.data.len()
        )));
    }
    if m.reconfigure_handles.len() > MAX_HANDLES
        || m.reconfigure_handles
            .iter()
            .any(|h| h.len() > MAX_HANDLE_BYTES)
    {
        return Err(Status::invalid_argument(format!(
            "the quorum request has {} reconfigure handles; at most {MAX_HANDLES} of at most {MAX_HANDLE_BYTES} bytes",
            m.reconfigure_handles.len()
        )));
    }
    Ok(())
}

/// Checks a replica id: not empty, bounded.
pub fn check_id(id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument(
            "the request has no replica_id; torchft's managers send `{group}:{uuid}`",
        ));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(Status::invalid_argument(format!(
            "the replica_id has {} bytes; at most {MAX_ID_BYTES}",
            id.len()
        )));
    }
    // It is shown on the status page and by `rdzv-server status`.
    if id.chars().any(char::is_control) {
        return Err(Status::invalid_argument(
            "the replica_id has control characters",
        ));
    }
    Ok(())
}
