package sched

import (
	"strconv"
	"strings"
)

// String describes the plan on one line, sequences by ID, for logs and tests:
//
//	decode 1 2; prefill 3@0+8 4@16+4; preempt 5; resume 5; drop 6; kv used 7 cached 2 free 1
//
// decode lists the chunks that compute one generated token; prefill the others, as
// ID@From+N (a chunk that starts past 0 at admission found From tokens in the prefix
// cache, or continues a chunked prefill); admit and resume the sequences that left the
// waiting queue, preempt, drop and onboard as in Plan; "over target" a step predicted past
// the ITL target (Plan.OverTarget); kv the pool's blocks after the step's
// reservations. A step with no chunks reads "idle".
func (p *Plan[S]) String() string {
	var b strings.Builder
	part := func(name string) {
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(name)
	}
	ids := func(name string, qs []S) {
		if len(qs) == 0 {
			return
		}
		part(name)
		for _, q := range qs {
			b.WriteByte(' ')
			b.WriteString(strconv.FormatUint(q.Sched().ID, 10))
		}
	}
	decodes, prefills := false, false
	for _, c := range p.Chunks {
		if c.Decode() {
			if !decodes {
				part("decode")
				decodes = true
			}
			b.WriteByte(' ')
			b.WriteString(strconv.FormatUint(c.Seq.Sched().ID, 10))
		}
	}
	for _, c := range p.Chunks {
		if !c.Decode() {
			if !prefills {
				part("prefill")
				prefills = true
			}
			b.WriteString(" " + strconv.FormatUint(c.Seq.Sched().ID, 10) + "@" + strconv.Itoa(c.From) + "+" + strconv.Itoa(c.N))
		}
	}
	if len(p.Chunks) == 0 {
		part("idle")
	}
	ids("admit", p.Admitted)
	ids("resume", p.Resumed)
	ids("preempt", p.Preempted)
	ids("drop", p.Dropped)
	ids("onboard", p.Onboard)
	if p.OverTarget {
		part("over target")
	}
	part("kv used " + strconv.Itoa(p.KV.Used) + " cached " + strconv.Itoa(p.KV.Cached) + " free " + strconv.Itoa(p.KV.Free))
	return b.String()
}
