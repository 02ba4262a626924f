//! The data-directory checker (`shoal-inspect` and the simulator call it): being written.
