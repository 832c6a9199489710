//! Reading a configuration file with a bound: accelerate's files are a few
//! hundred bytes, so anything over [`MAX_CONFIG_BYTES`] is a wrong path or a
//! hostile file, refused before it is parsed (or even read).

use std::io::Read;
use std::path::Path;

use super::LoadError;

/// Largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

pub(super) fn size_text(size: Option<u64>) -> String {
    match size {
        Some(n) => format!("{n} bytes"),
        None => format!("more than {MAX_CONFIG_BYTES} bytes"),
    }
}

/// The text of `path`, refused unread when its metadata says it is over
/// [`MAX_CONFIG_BYTES`], and never more than that read (so a file that grows
/// while it is read cannot exhaust memory either).
pub(super) fn read_bounded(path: &Path) -> Result<String, LoadError> {
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let too_large = |size| LoadError::TooLarge {
        path: path.to_path_buf(),
        size,
    };
    if size > MAX_CONFIG_BYTES {
        return Err(too_large(Some(size)));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_large(None));
    }
    String::from_utf8(bytes).map_err(|e| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "it is not UTF-8 text (byte {})",
                e.utf8_error().valid_up_to()
            ),
        ))
    })
}
