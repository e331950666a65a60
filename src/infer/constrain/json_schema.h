// JSON Schema (the subset a regular grammar can hold) compiled to a byte regex whose every
// match is a JSON document valid under the schema.
//
// Taken: type (one or a list), properties, required, additionalProperties (false, true or a
// schema for an object without properties), enum, const, items, minItems, maxItems, anyOf,
// allOf of one schema, $ref into $defs / definitions (not recursive), minLength, maxLength,
// pattern, format (date, time, date-time, uuid, ipv4, email), integer minimum / maximum /
// exclusiveMinimum / exclusiveMaximum, number minimum 0, and the annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly).
// Any other keyword is refused naming it and where it is.
//
// The text generated is compact JSON: one optional space after ':' and ','; properties in the
// schema's key order sorted by name (Loom's JSON objects keep keys sorted); only the listed
// properties, whatever additionalProperties says (so additionalProperties: false holds, and a
// schema that allows more still validates). Numbers have at most 16 integer digits, 16
// fraction digits and a 2-digit exponent (every number is a finite double). A value of any type (an
// empty schema, json_object) nests at most `any_depth` levels of objects and arrays.
#pragma once

#include "core/json.h"
#include "infer/constrain/byte_regex.h"

namespace loom::infer::constrain {

// Throws loom::Error "json_schema: <what> at <JSON pointer>", naming the keyword.
Rx json_schema_rx(const Json& schema, int any_depth = 3);
// Any JSON object (OpenAI's response_format json_object), nesting bounded.
Rx json_object_rx(int any_depth = 3);
// The characters of a JSON string (between the quotes) for a set of code points: each as
// itself, or escaped (\" \\ \n ...) where JSON requires it.
Rx json_string_chars(const CpRanges& cps);

}  // namespace loom::infer::constrain
