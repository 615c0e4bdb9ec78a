//! Page stamps: every 4 KiB page of a late-writes run carries one 8-byte stamp in its first
//! and in its last word, so a scan of two words per page tells who wrote the page last.
//!
//! | stamp | written by | bits 63..48 | bits 47..32 | bits 31..0 |
//! | --- | --- | --- | --- | --- |
//! | blank | nobody (fresh memory) | 0 | 0 | 0 |
//! | producer | P's WRITE (its source pages carry it) | `0x5057` ("PW") | generation | page of the write |
//! | reused | D, after its ledger said `Released` | `0x5245` ("RE") | 0 | page of the write |
//!
//! A page whose stamp goes from *reused* back to *producer* was written after D gave its
//! blocks to someone else: that is the violation the experiment looks for.

use std::sync::atomic::{AtomicU64, Ordering};

use kvdrain_nixl::agent::DramRegion;

/// Bytes per stamped page.
pub const PAGE: usize = 4096;
const WORDS_PER_PAGE: usize = PAGE / 8;
const PRODUCER_TAG: u64 = 0x5057;
const REUSED_TAG: u64 = 0x5245;

/// What one stamp word says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stamp {
    /// Never written.
    Blank,
    /// Written by the producer's WRITE of `generation`; `page` counts from the write's start.
    Producer {
        /// The run's generation (never 0).
        generation: u16,
        /// Page index within the write.
        page: u32,
    },
    /// Overwritten by the consumer after `Released`.
    Reused {
        /// Page index within the write.
        page: u32,
    },
    /// Anything else (a torn or foreign word).
    Other(u64),
}

impl Stamp {
    /// The stamp as a word.
    pub fn encode(self) -> u64 {
        match self {
            Stamp::Blank => 0,
            Stamp::Producer { generation, page } => {
                PRODUCER_TAG << 48 | u64::from(generation) << 32 | u64::from(page)
            }
            Stamp::Reused { page } => REUSED_TAG << 48 | u64::from(page),
            Stamp::Other(w) => w,
        }
    }

    /// Reads a word.
    pub fn decode(word: u64) -> Stamp {
        let page = (word & 0xffff_ffff) as u32;
        match word >> 48 {
            0 if word == 0 => Stamp::Blank,
            PRODUCER_TAG => Stamp::Producer {
                generation: (word >> 32 & 0xffff) as u16,
                page,
            },
            REUSED_TAG if word >> 32 & 0xffff == 0 => Stamp::Reused { page },
            _ => Stamp::Other(word),
        }
    }

    /// Whether this is a producer stamp of `generation`.
    pub fn is_producer(self, generation: u16) -> bool {
        matches!(self, Stamp::Producer { generation: g, .. } if g == generation)
    }
}

/// Page-aligned host memory that a NIXL peer may write at any time (hence atomics: reading
/// it while a WRITE lands is never undefined behaviour, only possibly torn across words).
#[derive(Debug)]
pub struct StampedPages {
    words: Box<[AtomicU64]>,
    /// Word index of page 0 (the allocation is aligned up to a page).
    first: usize,
    pages: usize,
}

impl StampedPages {
    /// `pages` blank pages.
    pub fn new(pages: usize) -> Self {
        let words: Box<[AtomicU64]> = (0..(pages + 1) * WORDS_PER_PAGE)
            .map(|_| AtomicU64::new(0))
            .collect();
        let addr = words.as_ptr() as usize;
        let first = (addr.next_multiple_of(PAGE) - addr) / 8;
        StampedPages {
            words,
            first,
            pages,
        }
    }

    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// The pages as one region (register it with the agent).
    pub fn region(&self) -> DramRegion {
        DramRegion::new(self.addr(0), self.pages * PAGE)
    }

    /// Address of page `page`.
    pub fn addr(&self, page: usize) -> usize {
        self.words.as_ptr() as usize + (self.first + page * WORDS_PER_PAGE) * 8
    }

    fn word(&self, page: usize, last: bool) -> &AtomicU64 {
        let w = self.first + page * WORDS_PER_PAGE + if last { WORDS_PER_PAGE - 1 } else { 0 };
        &self.words[w]
    }

    /// Writes `stamp` into the first and the last word of `page`.
    pub fn stamp(&self, page: usize, stamp: Stamp) {
        let w = stamp.encode();
        self.word(page, false).store(w, Ordering::Release);
        self.word(page, true).store(w, Ordering::Release);
    }

    /// The first and the last word of `page`, as words.
    pub fn read(&self, page: usize) -> (u64, u64) {
        (
            self.word(page, false).load(Ordering::Acquire),
            self.word(page, true).load(Ordering::Acquire),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_pages_are_aligned() {
        for s in [
            Stamp::Blank,
            Stamp::Producer {
                generation: 7,
                page: 65_535,
            },
            Stamp::Reused { page: 3 },
            Stamp::Other(0xdead_beef),
        ] {
            assert_eq!(Stamp::decode(s.encode()), s);
        }
        assert!(
            Stamp::decode(
                Stamp::Producer {
                    generation: 7,
                    page: 1
                }
                .encode()
            )
            .is_producer(7)
        );
        assert!(
            !Stamp::decode(
                Stamp::Producer {
                    generation: 7,
                    page: 1
                }
                .encode()
            )
            .is_producer(8)
        );
        let p = StampedPages::new(3);
        assert_eq!(p.addr(0) % PAGE, 0);
        assert_eq!(p.region().len, 3 * PAGE);
        p.stamp(2, Stamp::Reused { page: 2 });
        assert_eq!(
            p.read(2),
            (
                Stamp::Reused { page: 2 }.encode(),
                Stamp::Reused { page: 2 }.encode()
            )
        );
        assert_eq!(p.read(1), (0, 0));
    }
}
