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
	plan := &textPlan{}
	var wp *wordPiece
	ready := func() (err error) {
		wp, err = loadWordPiece(plan)
		return err
	}
	return jsonLines(planFile, plan, ready, func(line []byte) (interface{}, error) {
		var text string
		if err := json.Unmarshal(line, &text); err != nil {
			return nil, err
		}
		ids, truncated, ok := wp.encode([]byte(text))
		if !ok {
			return nil, nil
		}
		return map[string]interface{}{"ids": ids, "truncated": truncated}, nil
	})
}

// jsonLines is the loop of the door's test subcommands: the plan's JSON read from planFile
// into plan and made ready, then one JSON answer on stdout to each stdin line; 2 (the
// reason on stderr) for an unreadable plan or line, 0 at the end of stdin.
func jsonLines(planFile string, plan interface{}, ready func() error, answer func(line []byte) (interface{}, error)) int {
	data, err := os.ReadFile(planFile)
	if err == nil {
		err = json.Unmarshal(data, plan)
	}
	if err == nil {
		err = ready()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, planFile+":", err)
		return 2
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		a, err := answer(in.Bytes())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		_ = enc.Encode(a)
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}
