//! The GNU build id of an ELF64 little-endian file, from its program headers' `PT_NOTE` segments
//! (note type 3, `NT_GNU_BUILD_ID`, name `GNU`): only the file header, the program headers and the
//! note segments are read, each bounded, never the whole file.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

/// `PT_NOTE`.
const PT_NOTE: u32 = 4;
/// `NT_GNU_BUILD_ID`.
const NT_GNU_BUILD_ID: u32 = 3;
/// Size of one ELF64 program header.
const PHDR: usize = 56;
/// Program headers looked at (real objects have a dozen or so).
const MAX_PHDRS: usize = 256;
/// Bytes read of one note segment.
const MAX_NOTES: u64 = 64 << 10;
/// Longest build id taken (SHA-1 gives 20 bytes, some linkers up to 32).
const MAX_ID: usize = 64;

/// The build id of the file at `path`, in lowercase hex; `None` when it is no ELF64 little-endian
/// object or carries no build-id note.
pub fn build_id(path: &Path) -> io::Result<Option<String>> {
    build_id_from(&mut File::open(path)?)
}

/// [`build_id`] of an open file (or any seekable bytes).
pub fn build_id_from<R: Read + Seek>(file: &mut R) -> io::Result<Option<String>> {
    let mut header = [0u8; 64];
    if read_up_to(file, &mut header)? < header.len() {
        return Ok(None);
    }
    // Magic, ELFCLASS64, ELFDATA2LSB.
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Ok(None);
    }
    let phoff = u64_at(&header, 0x20);
    let phentsize = usize::from(u16_at(&header, 0x36));
    let phnum = usize::from(u16_at(&header, 0x38));
    if phentsize < PHDR || phnum == 0 || phnum > MAX_PHDRS {
        return Ok(None);
    }
    let mut table = vec![0u8; phentsize * phnum];
    file.seek(SeekFrom::Start(phoff))?;
    if read_up_to(file, &mut table)? < table.len() {
        return Ok(None);
    }
    for entry in table.chunks_exact(phentsize) {
        if u32_at(entry, 0) != PT_NOTE {
            continue;
        }
        let (offset, size, align) = (u64_at(entry, 8), u64_at(entry, 32), u64_at(entry, 48));
        let mut notes = vec![0u8; size.min(MAX_NOTES) as usize];
        file.seek(SeekFrom::Start(offset))?;
        let got = read_up_to(file, &mut notes)?;
        notes.truncate(got);
        if let Some(id) = find_build_id(&notes, if align == 8 { 8 } else { 4 }) {
            return Ok(Some(id));
        }
    }
    Ok(None)
}

/// The `GNU` build-id note among `notes` (a note segment's bytes, entries aligned to `align`).
fn find_build_id(notes: &[u8], align: usize) -> Option<String> {
    let up = |n: usize| n.checked_add(align - 1).map(|n| n / align * align);
    let mut at = 0usize;
    while at.checked_add(12)? <= notes.len() {
        let (namesz, descsz, kind) = (u32_at(notes, at) as usize, u32_at(notes, at + 4) as usize, u32_at(notes, at + 8));
        let name_start = at + 12;
        let desc_start = up(name_start.checked_add(namesz)?)?;
        let desc_end = desc_start.checked_add(descsz)?;
        if desc_end > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && notes[name_start..name_start + namesz] == *b"GNU\0" && (1..=MAX_ID).contains(&descsz) {
            return Some(notes[desc_start..desc_end].iter().map(|b| format!("{b:02x}")).collect());
        }
        at = up(desc_end)?;
    }
    None
}

/// Fills `buf` as far as the reader goes; the count read.
fn read_up_to<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A minimal ELF64 LE file: header, two program headers (a `PT_LOAD` and one `PT_NOTE` holding
    /// an ABI-tag note then the build-id note), the notes.
    fn tiny_elf(id: &[u8], align: u64) -> Vec<u8> {
        let mut notes = Vec::new();
        for (kind, desc) in [(1u32, &[0u8; 16][..]), (NT_GNU_BUILD_ID, id)] {
            notes.extend_from_slice(&4u32.to_le_bytes());
            notes.extend_from_slice(&(desc.len() as u32).to_le_bytes());
            notes.extend_from_slice(&kind.to_le_bytes());
            notes.extend_from_slice(b"GNU\0");
            notes.extend_from_slice(desc);
            while notes.len() % align as usize != 0 {
                notes.push(0);
            }
        }
        let phoff = 64u64;
        let notes_at = phoff + 2 * PHDR as u64;
        let mut file = vec![0u8; 64];
        file[..6].copy_from_slice(b"\x7fELF\x02\x01");
        file[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        file[0x36..0x38].copy_from_slice(&(PHDR as u16).to_le_bytes());
        file[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
        for (kind, offset, size) in [(1u32, 0u64, 0u64), (PT_NOTE, notes_at, notes.len() as u64)] {
            let mut ph = vec![0u8; PHDR];
            ph[..4].copy_from_slice(&kind.to_le_bytes());
            ph[8..16].copy_from_slice(&offset.to_le_bytes());
            ph[32..40].copy_from_slice(&size.to_le_bytes());
            ph[48..56].copy_from_slice(&align.to_le_bytes());
            file.extend_from_slice(&ph);
        }
        file.extend_from_slice(&notes);
        file
    }

    #[test]
    fn a_build_id_note_is_found_behind_another_note() {
        let id: Vec<u8> = (1..=20).collect();
        let want = "0102030405060708090a0b0c0d0e0f1011121314";
        for align in [4, 8] {
            assert_eq!(build_id_from(&mut Cursor::new(tiny_elf(&id, align))).unwrap().as_deref(), Some(want), "align {align}");
        }
        // A 5-byte id makes the 4-byte padding matter.
        let odd = build_id_from(&mut Cursor::new(tiny_elf(&[9, 8, 7, 6, 5], 4))).unwrap();
        assert_eq!(odd.as_deref(), Some("0908070605"));
    }

    #[test]
    fn not_elf64_le_or_cut_short_gives_none() {
        let good = tiny_elf(&[1; 20], 4);
        let mut big_endian = good.clone();
        big_endian[5] = 2;
        let mut elf32 = good.clone();
        elf32[4] = 1;
        for bytes in [b"#!/bin/sh\n".to_vec(), big_endian, elf32, good[..100].to_vec(), good[..good.len() - 3].to_vec()] {
            assert_eq!(build_id_from(&mut Cursor::new(bytes)).unwrap(), None);
        }
    }

    /// The build-id note as the linker writes it, found by scanning the whole file: the oracle the
    /// header-walking parser is checked against.
    fn scanned_build_id(bytes: &[u8]) -> Option<String> {
        let mut pattern = Vec::new();
        pattern.extend_from_slice(&4u32.to_le_bytes());
        pattern.extend_from_slice(&20u32.to_le_bytes());
        pattern.extend_from_slice(&NT_GNU_BUILD_ID.to_le_bytes());
        pattern.extend_from_slice(b"GNU\0");
        let at = bytes.windows(pattern.len()).position(|w| w == pattern)?;
        Some(bytes[at + 16..at + 36].iter().map(|b| format!("{b:02x}")).collect())
    }

    #[test]
    fn the_test_binary_agrees_with_a_scan_of_its_bytes() {
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let parsed = build_id(&exe).unwrap();
        assert_eq!(parsed, scanned_build_id(&bytes), "{}", exe.display());
        if let Some(id) = parsed {
            assert_eq!(id.len(), 40, "{id}");
        }
    }
}
