//! Whether a shared library file is whole, before the dynamic loader maps it.
//!
//! `dlopen` maps a library's loadable segments from the file as their
//! program headers say. A file cut short (a partial copy, an interrupted
//! download, a full disk) still has the headers of the whole library, and
//! the pages past its end are mapped all the same: the first touch of one
//! kills the process with SIGBUS ("Bus error"), with no word on which file.
//! The plugin loader reads every byte of the file anyway (to hash it), so
//! it checks here that every loadable segment, and the header tables, lie
//! within the bytes it read, and names the damage otherwise.
//!
//! Files that are not ELF (a Mach-O or PE library on another platform, or
//! not a library at all) are left to the loader, whose error names them.

use object::Endianness;
use object::elf::{ELFCLASS32, ELFCLASS64, ELFMAG, FileHeader32, FileHeader64, PT_LOAD};
use object::read::elf::{FileHeader, ProgramHeader};

/// `Ok` when `bytes` are not ELF or are a whole ELF file; else what is
/// wrong with them, as a sentence about "it" (the library).
pub(crate) fn check_whole_library(bytes: &[u8]) -> Result<(), String> {
    if !bytes.starts_with(&ELFMAG) {
        return Ok(());
    }
    match bytes.get(4) {
        Some(&ELFCLASS64) => check::<FileHeader64<Endianness>>(bytes),
        Some(&ELFCLASS32) => check::<FileHeader32<Endianness>>(bytes),
        Some(class) => Err(format!(
            "its ELF class byte {class} is neither 32- nor 64-bit"
        )),
        None => Err(format!("it ends after {} bytes of ELF header", bytes.len())),
    }
}

/// [`check_whole_library`] for one ELF class.
fn check<Elf: FileHeader<Endian = Endianness>>(bytes: &[u8]) -> Result<(), String> {
    let len = bytes.len() as u64;
    let header = Elf::parse(bytes)
        .map_err(|e| format!("its ELF header is damaged or cut short ({e})"))?;
    let endian = header
        .endian()
        .map_err(|e| format!("its ELF header is damaged ({e})"))?;
    let segments = header.program_headers(endian, bytes).map_err(|e| {
        format!("its program header table does not lie within its {len} bytes ({e})")
    })?;
    for (index, segment) in segments.iter().enumerate() {
        if segment.p_type(endian) != PT_LOAD {
            continue;
        }
        let offset: u64 = segment.p_offset(endian).into();
        let size: u64 = segment.p_filesz(endian).into();
        match offset.checked_add(size) {
            Some(end) if end <= len => {}
            end => {
                return Err(format!(
                    "its loadable segment {index} spans bytes {offset}..{} but the file \
                     has {len}: it is truncated or damaged",
                    end.map_or_else(|| "2^64".to_string(), |end| end.to_string())
                ));
            }
        }
    }
    header.section_headers(endian, bytes).map_err(|e| {
        format!("its section header table does not lie within its {len} bytes ({e})")
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary: a whole ELF file of this platform.
    fn this_binary() -> Vec<u8> {
        std::fs::read("/proc/self/exe").expect("the test binary is readable")
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_whole_library_passes_and_any_cut_of_it_is_named() {
        let whole = this_binary();
        assert_eq!(check_whole_library(&whole), Ok(()));
        // Cut inside the loadable segments (past the headers), inside the
        // program headers, and inside the ELF header itself.
        for cut in [whole.len() / 2, whole.len() - 1, 100, 30, 5] {
            let err = check_whole_library(&whole[..cut]).expect_err("cut short");
            assert!(
                [
                    "truncated",
                    "cut short",
                    "does not lie within",
                    "ends after"
                ]
                .iter()
                .any(|word| err.contains(word)),
                "cut at {cut}: {err}"
            );
        }
    }

    #[test]
    fn files_that_are_not_elf_are_left_to_the_loader() {
        assert_eq!(check_whole_library(b""), Ok(()));
        assert_eq!(check_whole_library(b"MZ\x90\x00 a PE file"), Ok(()));
        let err = check_whole_library(b"\x7fELF\x07").expect_err("unknown class");
        assert!(err.contains("class byte 7"), "{err}");
    }
}
