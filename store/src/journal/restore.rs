//! Reading the journal back: every segment's records by header ([`JournalScan`]) and their payloads
//! ([`Reader`]). What is done with them is `recover`'s.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::segment::{self, DamagedSpan, Kind, Located};
use super::JOURNAL_DIR;
use crate::StoreError;

/// Everything the journal holds, by header.
#[derive(Debug, Default)]
pub struct JournalScan {
    pub records: Vec<Located>,
    pub damaged: Vec<DamagedSpan>,
    /// Each segment and its length.
    pub segments: Vec<(u64, u64)>,
    /// The newest segment and the end of its last good record: where appending resumes.
    pub resume: Option<(u64, u64)>,
    /// Conversations removed on purpose.
    pub deleted: HashSet<u64>,
}

impl JournalScan {
    /// Reads every segment of the journal in `data` (none: an empty scan).
    pub fn read(data: &Path) -> Result<JournalScan, StoreError> {
        let dir = data.join(JOURNAL_DIR);
        let io = |path: &Path, source| StoreError::Spill { path: path.to_path_buf(), source };
        let mut scan = JournalScan::default();
        for (number, path) in segment::list(&dir).map_err(|e| io(&dir, e))? {
            let bytes = std::fs::read(&path).map_err(|e| io(&path, e))?;
            let found = segment::scan_bytes(number, &bytes);
            scan.segments.push((number, found.len));
            scan.resume = Some((number, found.valid_end));
            scan.deleted.extend(found.records.iter().filter(|r| r.kind == Kind::Deleted).map(|r| r.conversation));
            scan.records.extend(found.records);
            scan.damaged.extend(found.damaged);
        }
        Ok(scan)
    }

    /// The highest id the journal names for each kind of record: (conversation, turn, finding).
    pub fn max_ids(&self) -> (u64, u64, u64) {
        let mut max = (0, 0, 0);
        for record in &self.records {
            max.0 = max.0.max(record.conversation);
            match record.kind {
                Kind::Turn => max.1 = max.1.max(record.id),
                Kind::Finding => max.2 = max.2.max(record.id),
                Kind::Deleted => {}
            }
        }
        max
    }

    /// The turns the journal holds (of conversations not removed on purpose).
    pub fn turn_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.live(Kind::Turn).map(|r| r.id)
    }

    /// The records of conversations not removed on purpose, of one kind.
    pub(crate) fn live(&self, kind: Kind) -> impl Iterator<Item = &Located> {
        self.records.iter().filter(move |r| r.kind == kind && !self.deleted.contains(&r.conversation))
    }

    /// For each damaged stretch, the turn ids that could have stood in it: those between the last
    /// turn before it and the first after it (in the journal's order, which is commit order).
    pub fn gaps(&self) -> Vec<(DamagedSpan, std::ops::RangeInclusive<u64>)> {
        self.damaged
            .iter()
            .map(|span| {
                let before_span = |r: &Located| (r.segment, r.offset) < (span.segment, span.start);
                let mut turns = self.records.iter().filter(|r| r.kind == Kind::Turn);
                let before = turns.clone().rfind(|r| before_span(r)).map_or(0, |r| r.id);
                let after = turns.find(|r| !before_span(r)).map_or(u64::MAX, |r| r.id);
                (*span, before + 1..=after.saturating_sub(1))
            })
            .collect()
    }
}

/// Reads payloads from segment files, keeping the last one open.
pub(crate) struct Reader {
    dir: std::path::PathBuf,
    open: Option<(u64, std::fs::File)>,
}

impl Reader {
    pub fn new(data: &Path) -> Reader {
        Reader { dir: data.join(JOURNAL_DIR), open: None }
    }

    pub fn payload(&mut self, record: &Located) -> Result<Vec<u8>, StoreError> {
        let path = self.dir.join(segment::file_name(record.segment));
        let io = |source| StoreError::Spill { path: path.clone(), source };
        if self.open.as_ref().is_none_or(|(n, _)| *n != record.segment) {
            self.open = Some((record.segment, std::fs::File::open(&path).map_err(io)?));
        }
        let (_, file) = self.open.as_mut().expect("opened above");
        file.seek(SeekFrom::Start(record.offset)).map_err(io)?;
        let mut payload = vec![0; record.len as usize];
        file.read_exact(&mut payload).map_err(io)?;
        Ok(payload)
    }
}
