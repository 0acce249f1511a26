// VQA-Med 2019 (ImageCLEF) as M3AE's fine-tuning preprocessing reads it: under
// the release's root, per split (train, val, test), QA/Modality.csv,
// QA/Organ.csv and QA/Plane.csv hold lines `image_id|question|answer`, and
// images/<image_id>.jpg the images. Every question is open-ended; its
// question type is the file's category (MODALITY, ORGAN, PLANE). Question ids
// count the lines in M3AE's order (train, val, test; Modality, Organ, Plane),
// from 0, so that they match M3AE's.
#pragma once

#include <cstdint>
#include <string>

#include "convert_records.h"  // Record, RecordProblems, RecordSplit

namespace vqa::prep {

// The three category files of one split, in M3AE's order.
inline constexpr const char* kMedVqa2019Categories[] = {"Modality", "Organ", "Plane"};

// Reads ROOT/SPLIT/QA/<category>.csv. The question is kept as the file has it
// (raw_question; M3AE splits the line on '|' and keeps the pieces), the file's
// trailing newline aside. A missing or empty file throws DataFormatError
// naming it; a bad line (not three fields, an empty field, an image that is
// not there, an image_id seen before in the same file) is reported with the
// file, the line number and the field and skipped (RecordProblems: or thrown
// with --strict).
// `next_qid` is the next question id, advanced over every line read.
RecordSplit records_read_medvqa2019(const std::string& root, const std::string& split,
                                    int64_t& next_qid, RecordProblems& problems);

}  // namespace vqa::prep
