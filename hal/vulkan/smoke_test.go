package vulkan

import "testing"

func TestSmoke(t *testing.T) {
	ds, err := Devices()
	t.Logf("devices %+v err %v", ds, err)
	b, err := New(Options{Device: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	t.Log(b.Name())
	x, err := b.NewBuf(10)
	if err != nil {
		t.Fatal(err)
	}
	y, _ := b.NewBuf(10)
	b.WriteBuf(x, []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	b.WriteBuf(y, []float32{1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	b.Add(x, y)
	got := make([]float32, 10)
	if err := b.ReadBuf(got, x); err != nil {
		t.Fatal(err)
	}
	t.Log(got, b.Err())
}
