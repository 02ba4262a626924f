//! Feeds arbitrary bytes to every batch decoder: none may panic, and whatever `validate` accepts
//! must also iterate cleanly, record by record, to the declared count.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_proto::batch::{self, BatchHeader, BatchLimits, Compression};

fuzz_target!(|data: &[u8]| {
    let _ = BatchHeader::parse(data);
    let limits = BatchLimits::default();
    let validated = batch::validate(data, &limits);

    if let Ok(iter) = batch::records(data) {
        let mut record_count = 0u32;
        let mut failed = false;
        for record in iter {
            match record {
                Ok(record) => {
                    record_count += 1;
                    for (key, value) in record.headers {
                        let _ = (key.len(), value.map(<[u8]>::len));
                    }
                }
                Err(_) => failed = true,
            }
        }
        if let Ok(header) = validated {
            assert!(!failed, "validate accepted a batch whose records do not iterate");
            assert_eq!(record_count, header.record_count());
        }
    }

    if let Ok(header) = validated {
        assert_eq!(header.total_size(), data.len());
        if header.compression() == Compression::None {
            assert!(batch::records(data).is_ok());
        }
    }
});
