package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

// tokenizeLines is `frontdoor tokenize PLAN`: the door's tokenizer on its own, for tests
// that compare it with the router's (tests/integration/test_door_tokenizer.py). PLAN is a
// text plan's JSON (core/direct_plan.py text_plan); each stdin line a JSON string; each
// stdout line {"ids": [...], "truncated": bool}, or null for a text the router tokenizes.
func tokenizeLines(planFile string) int {
	data, err := os.ReadFile(planFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	plan := &textPlan{}
	if err := json.Unmarshal(data, plan); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	wp, err := loadWordPiece(plan)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		var text string
		if err := json.Unmarshal(in.Bytes(), &text); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		ids, truncated, ok := wp.encode([]byte(text))
		if !ok {
			_ = enc.Encode(nil)
			continue
		}
		_ = enc.Encode(map[string]interface{}{"ids": ids, "truncated": truncated})
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}
