package live

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"tandem/internal/statefile"
	"tandem/router"
)

// A restarted router learns its models again from the workers that re-register. Without a
// memory of the cards, the first worker to come back would set its model's block size and
// salt, and a stray worker with the wrong block size could win that race and shut out the
// rest. So the router keeps each model's card (model, hash version, block size, salt) in its
// state directory, and holds re-registering workers to it.

// cardsFile is the file in the state directory that remembers the models' cards.
const cardsFile = "models.json"

// cardStore keeps the models' cards in a JSON file.
type cardStore struct {
	path string
	mu   sync.Mutex
}

// load returns the remembered cards by model (none if the file does not exist yet).
func (s *cardStore) load() (map[string]router.Card, error) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]router.Card{}, nil
	}
	if err != nil {
		return nil, err
	}
	var list []router.Card
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("%s: %w (remove it to forget the models' cards)", s.path, err)
	}
	cards := make(map[string]router.Card, len(list))
	for _, c := range list {
		if c.Model == "" || c.BlockSize <= 0 {
			return nil, fmt.Errorf("%s: invalid card %+v (remove it to forget the models' cards)", s.path, c)
		}
		cards[c.Model] = c
	}
	return cards, nil
}

// add remembers c (its KV capacity, role and KV format, which differ by worker, are not
// kept).
func (s *cardStore) add(c router.Card) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cards, err := s.load()
	if err != nil {
		return err
	}
	c.KVBlocks, c.Role, c.KVFormat, c.Node = 0, "", "", "" // the model's, not one worker's
	cards[c.Model] = c
	list := make([]router.Card, 0, len(cards))
	for _, c := range cards {
		list = append(list, c)
	}
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	return statefile.Write(s.path, append(b, '\n'), 0o600)
}

func newCardStore(dir string) *cardStore { return &cardStore{path: filepath.Join(dir, cardsFile)} }
